//! The I/O shell: one actor per file, each owning one piece of state and one
//! kind of I/O (docs/ARCHITECTURE.md, "Actors and threads").

pub mod controller;
pub mod controller_client;
pub mod fetch_purgatory;
pub mod log_appender;
pub mod metadata_listeners;
pub mod quorum_state;
pub mod request_manager;
pub mod state_machine;
pub mod transport;
