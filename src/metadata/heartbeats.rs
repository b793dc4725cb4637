//! Brokers' heartbeats on the active controller (Kafka's
//! BrokerHeartbeatManager): soft state, never written to the log, rebuilt
//! by a new active controller from its image. Two parts:
//!
//! - [`next_state`]: where a broker's heartbeat takes it: fenced until its
//!   metadata has caught up to its own registration, unfenced after, into
//!   controlled shutdown while it still leads partitions, then told to shut
//!   down;
//! - [`Sessions`]: when an unfenced broker last reached the controller, and
//!   which ones have been silent past `broker.session_timeout_ms` (the
//!   controller fences those).

use std::collections::BTreeMap;

use super::records::BrokerId;
use crate::types::Offset;

/// Where a registered broker stands with the controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BrokerState {
    /// Registered, not (or no longer) serving: leads nothing, in no ISR.
    Fenced,
    Unfenced,
    /// Shutting down: its leaderships are being moved away.
    ControlledShutdown,
    /// May exit now.
    ShutdownNow,
}

/// What a broker's heartbeat says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    /// How far its metadata log has been replayed.
    pub metadata_offset: Offset,
    pub want_fence: bool,
    pub want_shutdown: bool,
}

/// Where `heartbeat` takes a broker now in `current`, registered at
/// `registration_offset` (its broker epoch), which `leads` partitions or
/// not.
pub fn next_state(current: BrokerState, heartbeat: Heartbeat, registration_offset: Offset, leads: bool) -> BrokerState {
    use BrokerState::*;
    match current {
        // A fenced broker leads nothing: it may go at once.
        Fenced if heartbeat.want_shutdown => ShutdownNow,
        Fenced if !heartbeat.want_fence && heartbeat.metadata_offset >= registration_offset => Unfenced,
        Fenced => Fenced,
        Unfenced if heartbeat.want_fence && heartbeat.want_shutdown => ShutdownNow,
        Unfenced if heartbeat.want_fence => Fenced,
        Unfenced if heartbeat.want_shutdown && leads => ControlledShutdown,
        Unfenced if heartbeat.want_shutdown => ShutdownNow,
        Unfenced => Unfenced,
        // Controlled shutdown is not taken back; it ends once nothing is
        // led any more.
        ControlledShutdown if leads => ControlledShutdown,
        ControlledShutdown => ShutdownNow,
        ShutdownNow => ShutdownNow,
    }
}

/// When each unfenced broker was last heard from.
#[derive(Debug)]
pub struct Sessions {
    timeout_ms: u64,
    last_contact_ms: BTreeMap<BrokerId, u64>,
}

impl Sessions {
    pub fn new(timeout_ms: u64) -> Sessions {
        Sessions {
            timeout_ms,
            last_contact_ms: BTreeMap::new(),
        }
    }

    /// Broker `id` (unfenced) was heard from at `now_ms`. A new active
    /// controller touches every unfenced broker of its image once, giving
    /// each a whole session before it can be fenced.
    pub fn touch(&mut self, id: BrokerId, now_ms: u64) {
        let last = self.last_contact_ms.entry(id).or_insert(now_ms);
        *last = (*last).max(now_ms);
    }

    /// The session timeout.
    pub fn timeout_ms(&self) -> u64 {
        self.timeout_ms
    }

    /// Whether broker `id` was heard from within the session timeout.
    pub fn alive(&self, id: BrokerId, now_ms: u64) -> bool {
        self.last_contact_ms
            .get(&id)
            .is_some_and(|last| now_ms.saturating_sub(*last) <= self.timeout_ms)
    }

    /// Broker `id` is fenced or gone: its silence no longer matters.
    pub fn forget(&mut self, id: BrokerId) {
        self.last_contact_ms.remove(&id);
    }

    /// The brokers silent for longer than the session timeout at `now_ms`,
    /// the longest silent first.
    pub fn expired(&self, now_ms: u64) -> Vec<BrokerId> {
        let mut expired: Vec<(u64, BrokerId)> = self
            .last_contact_ms
            .iter()
            .filter(|(_, last)| now_ms.saturating_sub(**last) > self.timeout_ms)
            .map(|(id, last)| (*last, *id))
            .collect();
        expired.sort_unstable();
        expired.into_iter().map(|(_, id)| id).collect()
    }

    /// When the next broker expires if none is heard from again.
    pub fn next_expiry_ms(&self) -> Option<u64> {
        self.last_contact_ms
            .values()
            .min()
            .map(|last| last.saturating_add(self.timeout_ms).saturating_add(1))
    }
}

#[cfg(test)]
mod tests {
    use super::BrokerState::*;
    use super::*;

    fn beat(metadata_offset: Offset, want_fence: bool, want_shutdown: bool) -> Heartbeat {
        Heartbeat {
            metadata_offset,
            want_fence,
            want_shutdown,
        }
    }

    #[test]
    fn a_broker_is_unfenced_once_its_metadata_reaches_its_registration() {
        let registered_at = 40;
        assert_eq!(next_state(Fenced, beat(39, false, false), registered_at, false), Fenced);
        assert_eq!(
            next_state(Fenced, beat(40, false, false), registered_at, false),
            Unfenced
        );
        assert_eq!(
            next_state(Fenced, beat(90, true, false), registered_at, false),
            Fenced,
            "it asked to stay fenced"
        );
        assert_eq!(
            next_state(Unfenced, beat(90, false, false), registered_at, true),
            Unfenced
        );
        assert_eq!(next_state(Unfenced, beat(90, true, false), registered_at, true), Fenced);
    }

    #[test]
    fn shutdown_waits_for_the_brokers_leaderships_to_move() {
        assert_eq!(
            next_state(Unfenced, beat(90, false, true), 40, true),
            ControlledShutdown
        );
        assert_eq!(
            next_state(ControlledShutdown, beat(90, false, true), 40, true),
            ControlledShutdown
        );
        assert_eq!(
            next_state(ControlledShutdown, beat(90, false, false), 40, true),
            ControlledShutdown,
            "no way back"
        );
        assert_eq!(
            next_state(ControlledShutdown, beat(90, false, true), 40, false),
            ShutdownNow
        );
        assert_eq!(
            next_state(Unfenced, beat(90, false, true), 40, false),
            ShutdownNow,
            "nothing to move"
        );
        assert_eq!(
            next_state(Fenced, beat(0, false, true), 40, false),
            ShutdownNow,
            "a fenced broker leads nothing"
        );
        assert_eq!(next_state(Unfenced, beat(90, true, true), 40, true), ShutdownNow);
        assert_eq!(next_state(ShutdownNow, beat(90, false, false), 40, false), ShutdownNow);
    }

    #[test]
    fn brokers_silent_past_the_session_timeout_expire_longest_silent_first() {
        let mut sessions = Sessions::new(1_000);
        sessions.touch(1, 100);
        sessions.touch(2, 50);
        sessions.touch(3, 900);
        assert_eq!(sessions.next_expiry_ms(), Some(1_051));
        assert!(sessions.expired(1_050).is_empty(), "exactly the timeout is not past it");
        assert_eq!(sessions.expired(1_100), [2]);
        assert_eq!(sessions.expired(1_101), [2, 1]);
        assert_eq!(sessions.expired(2_000), [2, 1, 3]);
        sessions.touch(2, 1_500);
        sessions.touch(1, 10);
        assert_eq!(sessions.expired(2_000), [1, 3], "an older contact never moves one back");
        sessions.forget(1);
        assert_eq!(sessions.expired(2_000), [3]);
        assert_eq!(sessions.next_expiry_ms(), Some(1_901));
        // Alive is the other side of expired; a forgotten broker is not.
        assert!(sessions.alive(3, 1_900) && !sessions.alive(3, 1_901));
        assert!(!sessions.alive(1, 1_000), "forgotten");
    }
}
