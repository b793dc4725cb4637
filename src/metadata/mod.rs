//! The metadata half of a KRaft quorum: the records of the metadata log
//! (`records`) and the image of the cluster replayed from them (`image`).
//! Not yet wired into the node: nothing replays the log into an image
//! yet, and no controller writes these records.

pub mod image;
pub mod records;
