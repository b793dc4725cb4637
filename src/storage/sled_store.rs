//! sled backend (written by the storage work).
