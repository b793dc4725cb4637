//! What one seed simulates: cluster shape, fault mix and engine settings.
//!
//! Like TigerBeetle's VOPR, every seed draws its own mix, so that across many
//! seeds the simulator visits calm clusters, lossy ones, crash-heavy ones and
//! everything between, with tight and loose engine timeouts.

use std::collections::BTreeMap;

use kraft::raft::{Epoch, NodeId, RaftConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Mixed into a seed for the second stream of draws ([`SimParams::late_options`]).
const LATE_OPTIONS_STREAM: u64 = 0x6c61_7465_5f6f_7074;

/// The epoch an [`SimParams::start_epoch`] seed starts from: three elections
/// before the largest epoch, so that a run soon has none left.
pub const NEAR_MAX_EPOCH: Epoch = Epoch::MAX - 3;

/// One seed's settings. Intervals are the *mean* gap between two faults of a
/// kind (uniform in `[0, 2 × mean]`); 0 disables that fault.
#[derive(Clone, Debug)]
pub struct SimParams {
    pub voters: usize,
    pub observers: usize,

    // Network.
    /// Probability that one message is lost.
    pub loss: f64,
    /// Probability that a delivered message is delivered twice.
    pub dup: f64,
    pub delay_min_ms: u64,
    pub delay_max_ms: u64,
    /// Probability that a request the network dropped is reported to the
    /// sender with `handle_request_failed` (otherwise the engine's own
    /// request timeout must notice).
    pub fail_notify: f64,

    // Faults.
    pub partition_every_ms: u64,
    pub partition_len_max_ms: u64,
    pub crash_every_ms: u64,
    pub restart_delay_max_ms: u64,
    /// Probability that a crash lands in the middle of the action list of a
    /// step (after a random prefix of the actions was carried out). Tests
    /// "persist, then switch, then reply".
    pub crash_mid_actions: f64,
    pub resign_every_ms: u64,

    // Disk and clock.
    pub disk_delay_min_ms: u64,
    pub disk_delay_max_ms: u64,
    /// When not 0, observers' flushes take up to this long instead of
    /// `disk_delay_max_ms` (a slow broker disk): long enough that an
    /// observer's fetch timeout passes while its last fetched batches are
    /// still unflushed, and it goes looking for the leader with them.
    pub slow_observer_disk_max_ms: u64,
    /// Each node's shell also ticks the engine at random gaps up to this.
    pub tick_every_max_ms: u64,

    // Clients.
    pub propose_every_ms: u64,
    /// Share of proposals sent to a node that is not the leader.
    pub propose_to_non_leader: f64,
    pub max_records_per_proposal: usize,
    pub max_record_pad_bytes: usize,

    // Engine settings (RaftConfig).
    pub election_timeout_ms: u64,
    pub fetch_timeout_ms: u64,
    pub retry_backoff_ms: u64,
    pub request_timeout_ms: u64,
    pub election_backoff_max_ms: u64,
    pub append_linger_ms: u64,
    pub max_batch_bytes: usize,
    pub max_idle_interval_ms: u64,
    pub fetch_max_wait_ms: u64,
    /// A late option (drawn in [`SimParams::late_options`]); 0 is Kafka's
    /// rule, answering at once.
    pub high_watermark_linger_ms: u64,
    pub fetch_max_bytes: u32,
    pub observer_session_ms: u64,

    // Election state.
    /// Every node starts with this persisted epoch (no vote, no leader).
    /// Near [`Epoch::MAX`] the cluster runs out of elections: a node at
    /// the largest epoch can only wait for a leader of it, so such a seed
    /// may end with no leader (see `Sim::settle`).
    pub start_epoch: Epoch,

    // Run length.
    /// Events (popped queue items) in the chaotic phase.
    pub chaos_events: u64,
    /// The final, fault-free convergence phase fails when it makes no
    /// progress for this long (virtual ms) ...
    pub settle_stall_ms: u64,
    /// ... or has not converged after this long.
    pub settle_max_ms: u64,
}

impl SimParams {
    /// The seed's own mix. Consumes draws from the run's RNG.
    pub fn random(rng: &mut SmallRng, chaos_events: u64) -> SimParams {
        let voters = *pick(rng, &[1, 2, 3, 3, 3, 3, 4, 5, 5, 5]);
        let observers = *pick(rng, &[0, 0, 0, 1, 1, 2]);

        let election_timeout_ms = rng.gen_range(150..=1000);
        let fetch_timeout_ms = 2 * election_timeout_ms;
        let delay_min_ms = rng.gen_range(0..=5);
        let delay_max_ms = delay_min_ms + *pick(rng, &[1, 5, 10, 20, 50, 100]);
        let fetch_max_wait_ms = *pick(rng, &[0, 50, 200, 500]).min(&(election_timeout_ms / 2));
        // A parked fetch must not look like a lost request.
        let request_timeout_ms = fetch_max_wait_ms + 2 * delay_max_ms + rng.gen_range(50..=election_timeout_ms);
        let lossy = rng.gen_bool(0.6);
        let disk_delay_max_ms = *pick(rng, &[1, 5, 20, 50]);

        SimParams {
            voters,
            observers,
            loss: if lossy { rng.gen_range(0.0..0.20) } else { 0.0 },
            dup: if rng.gen_bool(0.5) {
                rng.gen_range(0.0..0.20)
            } else {
                0.0
            },
            delay_min_ms,
            delay_max_ms,
            fail_notify: *pick(rng, &[0.0, 0.2, 0.5, 1.0]),
            partition_every_ms: *pick(rng, &[0, 1_000, 3_000, 10_000]),
            partition_len_max_ms: *pick(rng, &[500, 2_000, 8_000]),
            crash_every_ms: *pick(rng, &[0, 2_000, 5_000, 20_000]),
            restart_delay_max_ms: *pick(rng, &[0, 500, 5_000]),
            crash_mid_actions: *pick(rng, &[0.0, 0.0, 0.002, 0.01]),
            resign_every_ms: *pick(rng, &[0, 0, 5_000, 20_000]),
            disk_delay_min_ms: 0,
            disk_delay_max_ms,
            slow_observer_disk_max_ms: 0,
            tick_every_max_ms: *pick(rng, &[5, 20, 100]),
            propose_every_ms: *pick(rng, &[5, 20, 50, 200]),
            propose_to_non_leader: 0.1,
            max_records_per_proposal: *pick(rng, &[1, 3, 10]),
            max_record_pad_bytes: *pick(rng, &[0, 16, 200]),
            election_timeout_ms,
            fetch_timeout_ms,
            retry_backoff_ms: rng.gen_range(10..=50),
            request_timeout_ms,
            election_backoff_max_ms: *pick(rng, &[200, 1_000]),
            append_linger_ms: *pick(rng, &[0, 0, 1, 5]),
            max_batch_bytes: *pick(rng, &[kraft::messages::MAX_BATCH_BYTES, 4_096, 256]),
            // A follower gets at least one batch per fetch round trip; the
            // idle leader's NoOps must come slower than that, or a small
            // fetch size can never catch up (a property of the settings,
            // not of the protocol).
            max_idle_interval_ms: (*pick(rng, &[100, 500])).max(4 * (2 * delay_max_ms + disk_delay_max_ms)),
            fetch_max_wait_ms,
            high_watermark_linger_ms: 0,
            fetch_max_bytes: *pick(rng, &[kraft::messages::MAX_BATCH_BYTES as u32, 2_000, 300]),
            observer_session_ms: *pick(rng, &[300_000, 5_000]),
            start_epoch: 0,
            chaos_events,
            settle_stall_ms: 20_000,
            settle_max_ms: 300_000,
        }
    }

    /// Options added after seeds were first recorded. They take no draws
    /// from the run's RNG (they draw from a second stream of the seed, or
    /// use the seed itself), so a seed whose late options are off runs
    /// exactly the cluster it ran before, and the regression seeds keep
    /// replaying the runs that found their bugs (`tests/simulation.rs`
    /// checks that).
    pub fn late_options(mut self, seed: u64) -> SimParams {
        let mut rng = SmallRng::seed_from_u64(seed ^ LATE_OPTIONS_STREAM);
        if self.observers > 0 && rng.gen_bool(0.3) {
            self.slow_observer_disk_max_ms = 2 * self.fetch_timeout_ms;
        }
        // One seed in 20.
        if seed % 20 == 19 {
            self.start_epoch = NEAR_MAX_EPOCH;
        }
        // After the draws above, so that they stay what they were.
        self.high_watermark_linger_ms = *pick(&mut rng, &[0, 5, 5, 50]);
        self
    }

    /// A fault-free cluster for the scripted scenario tests: a reliable,
    /// fast network, fast disks, no random faults and no random clients.
    pub fn calm(voters: usize, observers: usize) -> SimParams {
        SimParams {
            voters,
            observers,
            loss: 0.0,
            dup: 0.0,
            delay_min_ms: 1,
            delay_max_ms: 5,
            fail_notify: 0.0,
            partition_every_ms: 0,
            partition_len_max_ms: 0,
            crash_every_ms: 0,
            restart_delay_max_ms: 0,
            crash_mid_actions: 0.0,
            resign_every_ms: 0,
            disk_delay_min_ms: 1,
            disk_delay_max_ms: 3,
            slow_observer_disk_max_ms: 0,
            tick_every_max_ms: 20,
            propose_every_ms: 0,
            propose_to_non_leader: 0.0,
            max_records_per_proposal: 1,
            max_record_pad_bytes: 0,
            election_timeout_ms: 300,
            fetch_timeout_ms: 600,
            retry_backoff_ms: 20,
            request_timeout_ms: 600,
            election_backoff_max_ms: 500,
            append_linger_ms: 0,
            max_batch_bytes: kraft::messages::MAX_BATCH_BYTES,
            max_idle_interval_ms: 500,
            fetch_max_wait_ms: 100,
            high_watermark_linger_ms: 5,
            fetch_max_bytes: kraft::messages::MAX_BATCH_BYTES as u32,
            observer_session_ms: 300_000,
            start_epoch: 0,
            chaos_events: 0,
            settle_stall_ms: 20_000,
            settle_max_ms: 300_000,
        }
    }

    /// Voters are 1..=voters, observers follow them.
    pub fn node_ids(&self) -> Vec<NodeId> {
        (1..=(self.voters + self.observers) as NodeId).collect()
    }

    pub fn raft_config(&self, node_id: NodeId) -> RaftConfig {
        let voters: BTreeMap<NodeId, String> = (1..=self.voters as NodeId).map(|id| (id, endpoint(id))).collect();
        let mut config = RaftConfig::new(node_id, voters, endpoint(node_id));
        config.election_timeout_ms = self.election_timeout_ms;
        config.fetch_timeout_ms = self.fetch_timeout_ms;
        config.retry_backoff_ms = self.retry_backoff_ms;
        config.request_timeout_ms = self.request_timeout_ms;
        config.election_backoff_max_ms = self.election_backoff_max_ms;
        config.append_linger_ms = self.append_linger_ms;
        config.max_batch_bytes = self.max_batch_bytes;
        config.max_idle_interval_ms = self.max_idle_interval_ms;
        config.fetch_max_wait_ms = self.fetch_max_wait_ms;
        config.high_watermark_linger_ms = self.high_watermark_linger_ms;
        config.fetch_max_bytes = self.fetch_max_bytes;
        config.observer_session_ms = self.observer_session_ms;
        config
    }

    /// One line for the seed summary.
    pub fn summary(&self) -> String {
        format!(
            "voters={} observers={} loss={:.3} dup={:.3} delay={}..{}ms fail_notify={} partition_every={}ms \
             crash_every={}ms restart_max={}ms crash_mid={} resign_every={}ms disk<={}ms tick<={}ms \
             propose_every={}ms election={}ms fetch={}ms request={}ms backoff_max={}ms linger={}ms max_batch={} fetch_wait={}ms hw_linger={}ms \
             fetch_bytes={} idle={}ms slow_observer_disk<={}ms start_epoch={}",
            self.voters,
            self.observers,
            self.loss,
            self.dup,
            self.delay_min_ms,
            self.delay_max_ms,
            self.fail_notify,
            self.partition_every_ms,
            self.crash_every_ms,
            self.restart_delay_max_ms,
            self.crash_mid_actions,
            self.resign_every_ms,
            self.disk_delay_max_ms,
            self.tick_every_max_ms,
            self.propose_every_ms,
            self.election_timeout_ms,
            self.fetch_timeout_ms,
            self.request_timeout_ms,
            self.election_backoff_max_ms,
            self.append_linger_ms,
            self.max_batch_bytes,
            self.fetch_max_wait_ms,
            self.high_watermark_linger_ms,
            self.fetch_max_bytes,
            self.max_idle_interval_ms,
            self.slow_observer_disk_max_ms,
            self.start_epoch,
        )
    }
}

pub fn endpoint(id: NodeId) -> String {
    format!("node-{id}:9093")
}

fn pick<'a, T>(rng: &mut SmallRng, choices: &'a [T]) -> &'a T {
    &choices[rng.gen_range(0..choices.len())]
}

/// A gap drawn uniformly in `[0, 2 × mean]` (mean > 0), at least 1 ms.
pub fn gap(rng: &mut SmallRng, mean_ms: u64) -> u64 {
    rng.gen_range(1..=2 * mean_ms.max(1))
}
