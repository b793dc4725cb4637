//! In-memory backend (written by the storage work).
