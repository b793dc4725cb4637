//! The metadata half of a KRaft quorum: the records of the metadata log
//! (this module so far), and, replayed from them, the image of the cluster
//! that every node keeps.

pub mod records;
