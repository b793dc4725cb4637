//! The metadata half of a KRaft quorum: the records of the metadata log
//! (`records`), the image of the cluster replayed from them (`image`),
//! where a new topic's replicas go (`placement`), which names a new topic
//! may have (`topics`), which topic configs may be set (`configs`), and
//! where brokers' heartbeats take them (`heartbeats`) and who leads a
//! partition, also when a broker is fenced (`partitions`).
//! In `node.state_machine = "metadata"` mode every node replays its
//! committed log into an image (`replay`), and the active controller
//! (`crate::actors::controller`) writes the records that `controller`'s
//! operations return.

pub mod configs;
pub mod controller;
pub mod heartbeats;
pub mod image;
pub mod partitions;
pub mod placement;
pub mod records;
pub mod replay;
pub mod topics;
