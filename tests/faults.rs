//! The fault harness: real `kraft` processes on 127.0.0.1, each link
//! between two nodes through a proxy the harness can cut
//! (`tests/fault/`). Writers append (log mode) or create topics (metadata
//! mode) through random nodes while a nemesis, drawn per cycle from a
//! printed seed, does one of: `kill -9` of the leader or of any node;
//! SIGSTOP of the leader past the fetch timeout, then SIGCONT; `kill -9`
//! of every node at once and a restart; isolating the leader; splitting
//! the nodes in two; cutting one link one way. After the last cycle every
//! fault is healed and the harness checks that every acknowledged write
//! is present exactly once (at the offset it was acknowledged with, in
//! log mode), that nothing that was never sent, or was refused as not
//! written, is present, that every node holds the same log (and, in
//! metadata mode, the same topics) and that offsets are contiguous. A
//! reader meanwhile makes linearizable reads, checked for linearizability
//! against the final log's order, and default (local) reads, checked for
//! prefix consistency. It prints one line of figures.
//!
//! CI runs a short fixed-seed sweep. A long run:
//! `KRAFT_FAULT_SEED=7 KRAFT_FAULT_CYCLES=300 KRAFT_FAULT_NODES=5 cargo test
//! --release --test faults -- --ignored --nocapture` (or
//! `scripts/fault-sweep.sh`, which runs many).

mod fault;
mod node_process;
mod ports;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fault::cluster::{http, Cluster, RECOVERY};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Raw appends (`node.state_machine = "log"`).
    Log,
    /// Topic creations on the metadata image (the default state machine).
    Metadata,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    KillLeader,
    KillAny,
    PauseLeader,
    KillAll,
    IsolateLeader,
    Split,
    OneWay,
}

const FAULTS: [Fault; 7] = [
    Fault::KillLeader,
    Fault::KillAny,
    Fault::PauseLeader,
    Fault::KillAll,
    Fault::IsolateLeader,
    Fault::Split,
    Fault::OneWay,
];

/// What became of one write.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    /// Acknowledged: at this offset (log mode), or with this topic id.
    Acked(String),
    /// Refused in a way that says nothing was written.
    Refused(String),
    /// Sent, and no answer says whether it was written.
    Unknown(String),
}

/// Every write, by its unique value (a record's text or a topic's name).
type History = Arc<Mutex<BTreeMap<String, Outcome>>>;

/// When each write was invoked and when its answer came.
type Timings = Arc<Mutex<BTreeMap<String, (Instant, Instant)>>>;

/// What a linearizable read saw: the high watermark (log mode) or the
/// topics (metadata mode).
#[derive(Clone, Debug)]
enum Seen {
    HighWatermark(i64),
    Topics(BTreeSet<String>),
}

/// One linearizable read that was answered.
#[derive(Clone, Debug)]
struct Read {
    invoked: Instant,
    completed: Instant,
    seen: Seen,
}

type Reads = Arc<Mutex<Vec<Read>>>;

/// What a default (local) read saw: a page of a node's committed log (log
/// mode), or a node's topics with the offset its image reflects
/// (metadata mode). Checked only for prefix consistency.
#[derive(Clone, Debug)]
enum LocalRead {
    Log(Vec<(i64, (String, Value))>),
    Topics { offset: i64, topics: BTreeSet<String> },
}

type LocalReads = Arc<Mutex<Vec<LocalRead>>>;

struct Run {
    mode: Mode,
    nodes: i32,
    cycles: u32,
    seed: u64,
}

/// The figures of a run.
#[derive(Debug, Default)]
struct Figures {
    faults: BTreeMap<String, u32>,
    acked: u64,
    refused: u64,
    unknown: u64,
    lost: Vec<String>,
    duplicated: Vec<String>,
    unsent: Vec<String>,
    divergent: Vec<String>,
    gaps: Vec<String>,
    reads: u64,
    /// Linearizability: a read missing a write acknowledged before it
    /// began, a read seeing a write begun after it ended, a read seeing
    /// less than one that ended before it began, a write ordered before
    /// one that ended before it began.
    stale: Vec<String>,
    future: Vec<String>,
    regressed: Vec<String>,
    reordered: Vec<String>,
    /// Local reads, and those that were not a prefix of the final history
    /// (a record other than the final log's at its offset, a hole in a
    /// page; two images at one offset with other topics, an image with
    /// fewer topics than an older one, a topic never created).
    local_reads: u64,
    inconsistent: Vec<String>,
    /// The writes in the final log, in its order (offset, value); in
    /// metadata mode, the topics with offset -1.
    final_writes: Vec<(i64, String)>,
    /// The final committed log (log mode).
    final_log: Records,
}

impl Figures {
    fn line(&self, run: &Run) -> String {
        let faults: Vec<String> = self.faults.iter().map(|(k, n)| format!("{k}={n}")).collect();
        format!(
            "faults[{:?} nodes={} seed={} cycles={}]: {}; acked={} refused={} unknown={} lost={} duplicated={} unsent={} divergent={} gaps={}; linearizable reads={} stale={} future={} regressed={} reordered={}; local reads={} inconsistent={}",
            run.mode,
            run.nodes,
            run.seed,
            run.cycles,
            faults.join(" "),
            self.acked,
            self.refused,
            self.unknown,
            self.lost.len(),
            self.duplicated.len(),
            self.unsent.len(),
            self.divergent.len(),
            self.gaps.len(),
            self.reads,
            self.stale.len(),
            self.future.len(),
            self.regressed.len(),
            self.reordered.len(),
            self.local_reads,
            self.inconsistent.len()
        )
    }

    fn clean(&self) -> bool {
        self.lost.is_empty()
            && self.duplicated.is_empty()
            && self.unsent.is_empty()
            && self.divergent.is_empty()
            && self.gaps.is_empty()
            && self.stale.is_empty()
            && self.future.is_empty()
            && self.regressed.is_empty()
            && self.reordered.is_empty()
            && self.inconsistent.is_empty()
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}: a number")))
}

/// One write through the node at `port`.
fn write(client: &reqwest::blocking::Client, mode: Mode, port: u16, value: &str) -> Outcome {
    let (path, body) = match mode {
        Mode::Log => ("/v1/append", json!({ "records": [value] })),
        Mode::Metadata => (
            "/v1/topics",
            json!({ "name": value, "partitions": 1, "replication_factor": 1 }),
        ),
    };
    let response = match client.post(format!("http://127.0.0.1:{port}{path}")).json(&body).send() {
        Ok(response) => response,
        // Nothing reached the node.
        Err(e) if e.is_connect() => return Outcome::Refused("connect".to_string()),
        Err(e) => return Outcome::Unknown(format!("no answer: {e}")),
    };
    let status = response.status();
    let Ok(body) = response.json::<Value>() else {
        return Outcome::Unknown(format!("{status} without a JSON body"));
    };
    if status.is_success() {
        return match mode {
            Mode::Log => Outcome::Acked(body["base_offset"].to_string()),
            Mode::Metadata => Outcome::Acked(body["id"].as_str().unwrap_or_default().to_string()),
        };
    }
    let code = body["error"].as_str().unwrap_or("?").to_string();
    match code.as_str() {
        // The outcome is open. A forwarded controller operation answers
        // UNAVAILABLE when it committed but this node's image lags.
        "OUTCOME_UNKNOWN" => Outcome::Unknown(code),
        "UNAVAILABLE" if mode == Mode::Metadata => Outcome::Unknown(code),
        _ => Outcome::Refused(code),
    }
}

/// Writers: each writes unique values through random nodes until stopped.
fn start_writers(
    mode: Mode,
    ports: Vec<u16>,
    writers: usize,
    seed: u64,
    history: History,
    timings: Timings,
    stop: Arc<AtomicBool>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..writers)
        .map(|w| {
            let (ports, history, stop) = (ports.clone(), history.clone(), stop.clone());
            let timings = timings.clone();
            std::thread::spawn(move || {
                let client = http();
                let mut rng = SmallRng::seed_from_u64(seed ^ (w as u64 + 1).wrapping_mul(0x9e37_79b9));
                let mut seq = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let value = format!("w{w}-{seq}");
                    seq += 1;
                    let port = ports[rng.gen_range(0..ports.len())];
                    let invoked = Instant::now();
                    let outcome = write(&client, mode, port, &value);
                    timings.lock().unwrap().insert(value.clone(), (invoked, Instant::now()));
                    let refused = matches!(outcome, Outcome::Refused(_));
                    history.lock().unwrap().insert(value, outcome);
                    if refused {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            })
        })
        .collect()
}

/// A reader: linearizable reads through random nodes until stopped; the
/// answered ones are kept with their times. Every other read is a local
/// one instead (of a random page of the log up to the highest high
/// watermark seen, or of the topics), kept in `local`.
fn start_reader(
    mode: Mode,
    ports: Vec<u16>,
    seed: u64,
    reads: Reads,
    local: LocalReads,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let client = http();
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed);
        let mut highest_hw = 0;
        while !stop.load(Ordering::SeqCst) {
            let port = ports[rng.gen_range(0..ports.len())];
            if rng.gen_bool(0.5) {
                let path = match mode {
                    Mode::Log => format!("/v1/log?from={}&max=20", rng.gen_range(0..=highest_hw)),
                    Mode::Metadata => "/v1/topics".to_string(),
                };
                let seen = get_ok(&client, port, &path).and_then(|body| match mode {
                    Mode::Log => body["records"]
                        .as_array()
                        .map(|records| LocalRead::Log(records.iter().filter_map(record_of).collect())),
                    Mode::Metadata => Some(LocalRead::Topics {
                        offset: body["offset"].as_i64()?,
                        topics: topic_names(&body),
                    }),
                });
                local.lock().unwrap().extend(seen);
                std::thread::sleep(Duration::from_millis(rng.gen_range(5..40)));
                continue;
            }
            let path = match mode {
                // From past any log end: only the high watermark comes back.
                Mode::Log => "/v1/log?consistency=linearizable&from=4611686018427387903&max=1",
                Mode::Metadata => "/v1/topics?consistency=linearizable",
            };
            let invoked = Instant::now();
            let answer = get_ok(&client, port, path);
            let completed = Instant::now();
            let seen = answer.and_then(|body| match mode {
                Mode::Log => body["high_watermark"].as_i64().map(Seen::HighWatermark),
                Mode::Metadata => body["topics"].as_array().map(|_| Seen::Topics(topic_names(&body))),
            });
            if let Some(Seen::HighWatermark(hw)) = seen {
                highest_hw = highest_hw.max(hw);
            }
            if let Some(seen) = seen {
                reads.lock().unwrap().push(Read {
                    invoked,
                    completed,
                    seen,
                });
            }
            std::thread::sleep(Duration::from_millis(rng.gen_range(5..40)));
        }
    })
}

/// The JSON of a successful `GET` of `path` on the node at `port`.
fn get_ok(client: &reqwest::blocking::Client, port: u16, path: &str) -> Option<Value> {
    client
        .get(format!("http://127.0.0.1:{port}{path}"))
        .send()
        .ok()
        .filter(|r| r.status().is_success())
        .and_then(|r| r.json::<Value>().ok())
}

/// Carries out one fault and heals it.
fn nemesis(cluster: &mut Cluster, client: &reqwest::blocking::Client, rng: &mut SmallRng, fault: Fault) {
    let ids = cluster.ids();
    let leader = cluster.leader(client).map(|(id, _)| id);
    let some_node = ids[rng.gen_range(0..ids.len())];
    let leader_or_any = leader.unwrap_or(some_node);
    match fault {
        Fault::KillLeader | Fault::KillAny => {
            let victim = if fault == Fault::KillLeader {
                leader_or_any
            } else {
                some_node
            };
            cluster.node(victim).kill9();
            std::thread::sleep(Duration::from_millis(rng.gen_range(200..1500)));
            cluster.node(victim).start();
        }
        Fault::PauseLeader => {
            // Past the fetch timeout (600 ms) and the leader's check-quorum
            // (1.5 × that): the others elect a new leader meanwhile.
            cluster.node(leader_or_any).pause();
            std::thread::sleep(Duration::from_millis(rng.gen_range(1200..2500)));
            cluster.node(leader_or_any).resume();
        }
        Fault::KillAll => {
            for id in &ids {
                cluster.node(*id).kill9();
            }
            std::thread::sleep(Duration::from_millis(rng.gen_range(100..800)));
            for id in &ids {
                cluster.node(*id).start();
            }
        }
        Fault::IsolateLeader | Fault::Split => {
            let side: Vec<i32> = if fault == Fault::IsolateLeader {
                vec![leader_or_any]
            } else {
                let mut shuffled = ids.clone();
                for i in (1..shuffled.len()).rev() {
                    shuffled.swap(i, rng.gen_range(0..=i));
                }
                shuffled.truncate(ids.len() / 2);
                shuffled
            };
            cluster.partition(&side);
            std::thread::sleep(Duration::from_millis(rng.gen_range(1200..3000)));
            cluster.heal();
        }
        Fault::OneWay => {
            let to = ids[rng.gen_range(0..ids.len())];
            let from = match ids.iter().copied().filter(|id| *id != to).collect::<Vec<_>>() {
                others if others.is_empty() => to,
                others => others[rng.gen_range(0..others.len())],
            };
            if from != to {
                cluster.set_cut(from, to, true);
                std::thread::sleep(Duration::from_millis(rng.gen_range(1200..3000)));
                cluster.set_cut(from, to, false);
            }
        }
    }
}

/// A node's committed records: offset → (kind, value).
type Records = BTreeMap<i64, (String, Value)>;

/// Every committed record of a node, and its high watermark.
fn read_log(cluster: &Cluster, client: &reqwest::blocking::Client, index: usize) -> Option<(i64, Records)> {
    let node = &cluster.nodes[index];
    let mut from = 0;
    let mut out = BTreeMap::new();
    let mut hw;
    loop {
        let page = node.get(client, &format!("/v1/log?from={from}&max=1000"))?;
        hw = page["high_watermark"].as_i64()?;
        let records = page["records"].as_array()?.clone();
        if records.is_empty() {
            if from == 0 {
                from = page["log_start_offset"].as_i64().unwrap_or(0);
                if from > 0 {
                    continue;
                }
            }
            break;
        }
        for r in records {
            let (offset, record) = record_of(&r)?;
            out.insert(offset, record);
            from = offset + 1;
        }
    }
    Some((hw, out))
}

/// A record of a `GET /v1/log` page: its offset, its kind, and its value
/// (the whole record for control records).
fn record_of(r: &Value) -> Option<(i64, (String, Value))> {
    let offset = r["offset"].as_i64()?;
    let value = if r["kind"] == "data" {
        r["value"].clone()
    } else {
        r.clone()
    };
    Some((offset, (r["kind"].as_str()?.to_string(), value)))
}

/// The topic names of a `GET /v1/topics` answer.
fn topic_names(body: &Value) -> BTreeSet<String> {
    body["topics"]
        .as_array()
        .map(|topics| {
            topics
                .iter()
                .filter_map(|t| t["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Prefix consistency of the local reads: each saw a prefix of the final
/// history. A log page holds the final log's records at their offsets,
/// without holes; images at one offset show the same topics, one at a
/// higher offset every topic of one at a lower (the harness never deletes
/// one), and no topic that was never created.
fn check_prefix(final_log: &Records, history: &BTreeMap<String, Outcome>, local: &[LocalRead], figures: &mut Figures) {
    figures.local_reads = local.len() as u64;
    let mut images: BTreeMap<i64, &BTreeSet<String>> = BTreeMap::new();
    for read in local {
        match read {
            LocalRead::Log(records) => {
                for pair in records.windows(2) {
                    if pair[1].0 != pair[0].0 + 1 {
                        figures
                            .inconsistent
                            .push(format!("a page went from offset {} to {}", pair[0].0, pair[1].0));
                    }
                }
                for (offset, record) in records {
                    if final_log.get(offset) != Some(record) {
                        figures.inconsistent.push(format!(
                            "a read saw {record:?} at {offset}, the final log has {:?}",
                            final_log.get(offset)
                        ));
                    }
                }
            }
            LocalRead::Topics { offset, topics } => {
                for name in topics {
                    if name != "marker" && !history.contains_key(name) {
                        figures
                            .inconsistent
                            .push(format!("a read saw topic {name}, never created"));
                    }
                }
                if let Some(other) = images.insert(*offset, topics) {
                    if other != topics {
                        figures
                            .inconsistent
                            .push(format!("two images at offset {offset} show other topics"));
                    }
                }
            }
        }
    }
    let mut previous: Option<(i64, &BTreeSet<String>)> = None;
    for (offset, topics) in images {
        if let Some((older, seen)) = previous {
            if let Some(missing) = seen.difference(topics).next() {
                figures
                    .inconsistent
                    .push(format!("the image at {offset} lacks topic {missing}, shown at {older}"));
            }
        }
        previous = Some((offset, topics));
    }
}

/// Heals everything, waits until every node has committed a last write made
/// through the leader, and checks the history against every node's log.
fn check(cluster: &mut Cluster, client: &reqwest::blocking::Client, run: &Run, history: &History) -> Figures {
    cluster.restore();
    let deadline = Instant::now() + RECOVERY;
    // A last write through the leader, retried until it is acknowledged.
    let marker = loop {
        assert!(Instant::now() < deadline, "no write after healing\n{}", cluster.logs());
        if let Some((leader, _)) = cluster.leader(client) {
            let port = cluster.nodes.iter().find(|n| n.id == leader).unwrap().http_port;
            match write(client, run.mode, port, "marker") {
                // An earlier try of the marker may have been written.
                Outcome::Acked(_) => break cluster.nodes.iter().position(|n| n.id == leader).unwrap(),
                Outcome::Refused(code) if code == "TOPIC_ALREADY_EXISTS" => {
                    break cluster.nodes.iter().position(|n| n.id == leader).unwrap()
                }
                _ => {}
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // What every node must reach: the leader's high watermark once the
    // marker is committed. Waiting reads only the nodes' status; the logs
    // (hundreds of thousands of records after a long metadata run) are
    // read once each node is there.
    let high_watermark = |index: usize| {
        cluster.nodes[index]
            .get(client, "/v1/quorum")
            .and_then(|q| q["high_watermark"].as_i64())
    };
    let target_hw = loop {
        assert!(
            Instant::now() < deadline,
            "the leader's status unreadable\n{}",
            cluster.logs()
        );
        if let Some(hw) = high_watermark(marker) {
            break hw;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut logs = Vec::new();
    for index in 0..cluster.nodes.len() {
        let deadline = Instant::now() + RECOVERY;
        while high_watermark(index).is_none_or(|hw| hw < target_hw) {
            assert!(
                Instant::now() < deadline,
                "node {} did not reach the high watermark {target_hw} within {RECOVERY:?} (it is at {:?})\n{}",
                cluster.nodes[index].id,
                high_watermark(index),
                cluster.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut tries = 0;
        let log = loop {
            match read_log(cluster, client, index) {
                Some((_, log)) => break log,
                None if tries < 20 => tries += 1,
                None => panic!("node {}'s log unreadable\n{}", cluster.nodes[index].id, cluster.logs()),
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        // Every node compares what all of them committed.
        logs.push(
            log.range(..target_hw)
                .map(|(o, r)| (*o, r.clone()))
                .collect::<BTreeMap<_, _>>(),
        );
    }
    // A metadata log is read from its start (what came before is in a
    // snapshot, as the image), which differs between nodes: they compare
    // what all of them hold. A log-mode log is read whole, from 0.
    let common_start = logs
        .iter()
        .filter_map(|log| log.keys().next().copied())
        .max()
        .unwrap_or(0);
    for log in &mut logs {
        *log = log.split_off(&common_start);
    }
    let history = history.lock().unwrap().clone();
    let mut figures = Figures::default();
    for outcome in history.values() {
        match outcome {
            Outcome::Acked(_) => figures.acked += 1,
            Outcome::Refused(_) => figures.refused += 1,
            Outcome::Unknown(_) => figures.unknown += 1,
        }
    }
    for (index, log) in logs.iter().enumerate().skip(1) {
        if *log != logs[0] {
            let first = (common_start..target_hw).find(|o| log.get(o) != logs[0].get(o));
            figures.divergent.push(format!(
                "node {} differs from node {} first at offset {first:?}",
                cluster.nodes[index].id, cluster.nodes[0].id
            ));
        }
    }
    let log = &logs[0];
    if run.mode == Mode::Log && common_start != 0 {
        figures
            .gaps
            .push(format!("a log-mode log read from offset {common_start}, not 0"));
    }
    if let Some(gap) = (common_start..target_hw).find(|o| !log.contains_key(o)) {
        figures.gaps.push(format!("offset {gap} missing below {target_hw}"));
    }
    match run.mode {
        Mode::Log => {
            check_log(log, &history, &mut figures);
            figures.final_log = log.clone();
        }
        Mode::Metadata => check_topics(cluster, client, &history, &mut figures),
    }
    figures
}

fn check_log(log: &Records, history: &BTreeMap<String, Outcome>, figures: &mut Figures) {
    let mut seen: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for (offset, (kind, value)) in log {
        if kind == "data" {
            let value = value.as_str().unwrap_or("");
            seen.entry(value).or_default().push(*offset);
            figures.final_writes.push((*offset, value.to_string()));
        }
    }
    for (value, outcome) in history {
        let at = seen.get(value.as_str());
        match outcome {
            Outcome::Acked(offset) if at.is_none_or(|offsets| offsets.iter().all(|o| o.to_string() != *offset)) => {
                figures
                    .lost
                    .push(format!("{value} acknowledged at {offset}, log has it at {at:?}"));
            }
            Outcome::Refused(code) if at.is_some() => {
                figures.unsent.push(format!("{value} refused ({code}) but at {at:?}"))
            }
            _ => {}
        }
    }
    for (value, offsets) in &seen {
        if offsets.len() > 1 && *value != "marker" {
            figures.duplicated.push(format!("{value} at {offsets:?}"));
        }
        if *value != "marker" && !history.contains_key(*value) {
            figures.unsent.push(format!("{value} at {offsets:?} was never sent"));
        }
    }
}

/// Topic names → ids, of a node's image, with the image's offset.
fn topics_of(
    cluster: &Cluster,
    client: &reqwest::blocking::Client,
    index: usize,
) -> Option<(i64, BTreeMap<String, String>)> {
    let image = cluster.nodes[index].get(client, "/v1/topics")?;
    let topics = image["topics"]
        .as_array()?
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap_or("").to_string(),
                t["id"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    Some((image["offset"].as_i64()?, topics))
}

fn check_topics(
    cluster: &Cluster,
    client: &reqwest::blocking::Client,
    history: &BTreeMap<String, Outcome>,
    figures: &mut Figures,
) {
    let mut views = Vec::new();
    for index in 0..cluster.nodes.len() {
        let deadline = Instant::now() + RECOVERY;
        let view = loop {
            assert!(
                Instant::now() < deadline,
                "no topics from node {}",
                cluster.nodes[index].id
            );
            match topics_of(cluster, client, index) {
                Some((_, topics)) if topics.contains_key("marker") => break topics,
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        views.push(view);
    }
    for (index, view) in views.iter().enumerate().skip(1) {
        if *view != views[0] {
            figures.divergent.push(format!(
                "node {}'s topics differ from node {}'s",
                cluster.nodes[index].id, cluster.nodes[0].id
            ));
        }
    }
    let topics = &views[0];
    figures.final_writes = topics.keys().map(|name| (-1, name.clone())).collect();
    for (name, outcome) in history {
        match (outcome, topics.get(name)) {
            (Outcome::Acked(id), Some(held)) if held != id => figures
                .lost
                .push(format!("{name} acknowledged with id {id}, the image has {held}")),
            (Outcome::Acked(id), None) => figures
                .lost
                .push(format!("{name} acknowledged with id {id}, not in the image")),
            (Outcome::Refused(code), Some(_)) => figures.unsent.push(format!("{name} refused ({code}) but exists")),
            _ => {}
        }
    }
    for name in topics.keys() {
        if name != "marker" && !history.contains_key(name) {
            figures.unsent.push(format!("{name} exists but was never created"));
        }
    }
}

/// The linearizability of the history (Porcupine's question, answered
/// directly for an append-only log whose order is known): with the final
/// log's order as the order of the writes, every linearizable read must
/// see each write acknowledged before it began, no write begun after it
/// ended, and no less than a read that ended before it began; and no
/// write may be ordered before one acknowledged before it began. Only
/// acknowledged writes bound anything by their answer: a write of unknown
/// outcome may take effect at any time after it began.
fn check_linearizable(
    final_writes: &[(i64, String)],
    history: &BTreeMap<String, Outcome>,
    timings: &BTreeMap<String, (Instant, Instant)>,
    reads: &[Read],
    figures: &mut Figures,
) {
    figures.reads = reads.len() as u64;
    let acked = |value: &str| matches!(history.get(value), Some(Outcome::Acked(_)));
    let position: BTreeMap<&str, i64> = final_writes.iter().map(|(o, v)| (v.as_str(), *o)).collect();
    // Acknowledged writes by the time their answer came, with the highest
    // position among those answered so far.
    let mut by_answer: Vec<(Instant, &str)> = timings
        .iter()
        .filter(|(value, _)| acked(value))
        .map(|(value, (_, answered))| (*answered, value.as_str()))
        .collect();
    by_answer.sort();
    let mut highest = Vec::with_capacity(by_answer.len() + 1);
    highest.push(-1);
    for (_, value) in &by_answer {
        let at = position.get(value).copied().unwrap_or(-1);
        highest.push(at.max(*highest.last().unwrap()));
    }
    // The writes in log order, with the latest start among those so far.
    let mut latest_start: Vec<Option<Instant>> = Vec::with_capacity(final_writes.len() + 1);
    latest_start.push(None);
    for (_, value) in final_writes {
        let start = timings.get(value).map(|(invoked, _)| *invoked);
        latest_start.push(start.max(*latest_start.last().unwrap()));
    }
    let mut by_end: Vec<&Read> = reads.iter().collect();
    by_end.sort_by_key(|r| r.completed);
    let size = |read: &Read| match &read.seen {
        Seen::HighWatermark(hw) => *hw,
        Seen::Topics(topics) => topics.len() as i64,
    };
    let mut most_seen = vec![i64::MIN];
    for read in &by_end {
        most_seen.push(size(read).max(*most_seen.last().unwrap()));
    }
    for read in reads {
        let before = by_answer.partition_point(|(answered, _)| *answered < read.invoked);
        match &read.seen {
            Seen::HighWatermark(hw) => {
                if highest[before] >= *hw {
                    figures.stale.push(format!(
                        "a read saw the log end at {hw}, but a write at {} was acknowledged before it began",
                        highest[before]
                    ));
                }
                let below = final_writes.partition_point(|(offset, _)| offset < hw);
                if latest_start[below].is_some_and(|start| start > read.completed) {
                    figures
                        .future
                        .push(format!("a read of the log end {hw} saw a write begun after it ended"));
                }
            }
            Seen::Topics(topics) => {
                for (_, name) in &by_answer[..before] {
                    if !topics.contains(*name) {
                        figures
                            .stale
                            .push(format!("a read missed topic {name}, acknowledged before it began"));
                    }
                }
                for name in topics {
                    if timings.get(name).is_some_and(|(invoked, _)| *invoked > read.completed) {
                        figures
                            .future
                            .push(format!("a read saw topic {name}, created after it ended"));
                    }
                }
            }
        }
        let ended_before = by_end.partition_point(|r| r.completed < read.invoked);
        if most_seen[ended_before] > size(read) {
            figures.regressed.push(format!(
                "a read saw {} after an earlier one saw {}",
                size(read),
                most_seen[ended_before]
            ));
        }
    }
    // Write order against real time (log mode: the final log is ordered).
    let mut latest = None;
    for (offset, value) in final_writes.iter().filter(|(offset, _)| *offset >= 0) {
        if let (true, Some((invoked, answered))) = (acked(value), timings.get(value)) {
            if latest.is_some_and(|l| *answered < l) {
                figures.reordered.push(format!(
                    "{value} at {offset} was acknowledged before a write below it began"
                ));
            }
            latest = latest.max(Some(*invoked));
        } else if let Some((invoked, _)) = timings.get(value) {
            latest = latest.max(Some(*invoked));
        }
    }
}

/// One run: a cluster, writers, `cycles` faults, the checks.
fn run(run: Run) -> Figures {
    println!(
        "fault run: {:?}, {} nodes, seed {}, {} cycles (replay: KRAFT_FAULT_SEED={} KRAFT_FAULT_NODES={} KRAFT_FAULT_CYCLES={})",
        run.mode, run.nodes, run.seed, run.cycles, run.seed, run.nodes, run.cycles
    );
    let sets: &[&str] = match run.mode {
        Mode::Log => &["node.state_machine=log"],
        Mode::Metadata => &[
            "node.state_machine=metadata",
            "broker.session_timeout_ms=3000",
            "broker.heartbeat_interval_ms=500",
        ],
    };
    let mut cluster = Cluster::start(run.nodes, sets);
    let client = http();
    if cluster.wait_for_leader(&client).is_none() {
        panic!("no first leader\n{}", cluster.logs());
    }
    let history: History = Default::default();
    let stop = Arc::new(AtomicBool::new(false));
    let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.http_port).collect();
    let timings: Timings = Default::default();
    let reads: Reads = Default::default();
    let local: LocalReads = Default::default();
    let writers = start_writers(
        run.mode,
        ports.clone(),
        3,
        run.seed,
        history.clone(),
        timings.clone(),
        stop.clone(),
    );
    let reader = start_reader(run.mode, ports, run.seed, reads.clone(), local.clone(), stop.clone());
    let mut rng = SmallRng::seed_from_u64(run.seed);
    let mut figures = Figures::default();
    for cycle in 0..run.cycles {
        let fault = FAULTS[rng.gen_range(0..FAULTS.len())];
        *figures.faults.entry(format!("{fault:?}")).or_default() += 1;
        nemesis(&mut cluster, &client, &mut rng, fault);
        std::thread::sleep(Duration::from_millis(rng.gen_range(300..1200)));
        if cluster.wait_for_leader(&client).is_none() {
            stop.store(true, Ordering::SeqCst);
            panic!("no leader after cycle {cycle} ({fault:?})\n{}", cluster.logs());
        }
    }
    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.join().unwrap();
    }
    reader.join().unwrap();
    let mut checked = check(&mut cluster, &client, &run, &history);
    let timings = timings.lock().unwrap().clone();
    let reads = reads.lock().unwrap().clone();
    let final_writes = std::mem::take(&mut checked.final_writes);
    check_linearizable(&final_writes, &history.lock().unwrap(), &timings, &reads, &mut checked);
    let final_log = std::mem::take(&mut checked.final_log);
    check_prefix(
        &final_log,
        &history.lock().unwrap(),
        &local.lock().unwrap(),
        &mut checked,
    );
    let figures = Figures {
        faults: figures.faults,
        ..checked
    };
    println!("{}", figures.line(&run));
    if !figures.clean() {
        panic!(
            "{}\nlost: {:?}\nduplicated: {:?}\nunsent: {:?}\ndivergent: {:?}\ngaps: {:?}\nstale: {:?}\nfuture: {:?}\nregressed: {:?}\nreordered: {:?}\ninconsistent: {:?}\n{}",
            figures.line(&run),
            figures.lost,
            figures.duplicated,
            figures.unsent,
            figures.divergent,
            figures.gaps,
            figures.stale.iter().take(10).collect::<Vec<_>>(),
            figures.future.iter().take(10).collect::<Vec<_>>(),
            figures.regressed.iter().take(10).collect::<Vec<_>>(),
            figures.reordered.iter().take(10).collect::<Vec<_>>(),
            figures.inconsistent.iter().take(10).collect::<Vec<_>>(),
            cluster.logs()
        );
    }
    assert!(
        figures.reads > 0,
        "no linearizable read was answered: {}",
        figures.line(&run)
    );
    assert!(figures.acked > 0, "nothing was acknowledged: {}", figures.line(&run));
    figures
}

#[test]
fn three_nodes_keep_every_acknowledged_append_through_faults() {
    run(Run {
        mode: Mode::Log,
        nodes: 3,
        cycles: 8,
        seed: 1,
    });
}

#[test]
fn five_nodes_keep_every_acknowledged_append_through_faults() {
    run(Run {
        mode: Mode::Log,
        nodes: 5,
        cycles: 8,
        seed: 2,
    });
}

#[test]
fn three_controllers_keep_every_acknowledged_topic_through_faults() {
    run(Run {
        mode: Mode::Metadata,
        nodes: 3,
        cycles: 6,
        seed: 3,
    });
}

/// A long run, from the environment (see the module docs).
#[test]
#[ignore]
fn long_fault_run() {
    let mode = match std::env::var("KRAFT_FAULT_MODE").as_deref() {
        Ok("metadata") => Mode::Metadata,
        _ => Mode::Log,
    };
    run(Run {
        mode,
        nodes: env_u64("KRAFT_FAULT_NODES").unwrap_or(3) as i32,
        cycles: env_u64("KRAFT_FAULT_CYCLES").unwrap_or(100) as u32,
        seed: env_u64("KRAFT_FAULT_SEED").unwrap_or(1),
    });
}

/// The checks themselves: a history and a log that break each rule are
/// counted under it.
#[test]
fn the_checks_count_lost_duplicated_and_unsent_writes() {
    let data = |value: &str| ("data".to_string(), json!(value));
    let log: Records = [
        (0, ("noop".to_string(), json!({}))),
        (1, data("w0-0")),
        (2, data("w0-1")),
        (3, data("w0-1")),
        (4, data("w0-3")),
        (5, data("stranger")),
        (6, data("marker")),
        (7, data("marker")),
    ]
    .into_iter()
    .collect();
    let history: BTreeMap<String, Outcome> = [
        ("w0-0", Outcome::Acked("1".into())),
        ("w0-1", Outcome::Acked("2".into())),
        ("w0-2", Outcome::Acked("9".into())),
        ("w0-3", Outcome::Refused("NOT_LEADER".into())),
        ("w0-4", Outcome::Unknown("timeout".into())),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let mut figures = Figures::default();
    check_log(&log, &history, &mut figures);
    assert_eq!(figures.lost.len(), 1, "w0-2: {:?}", figures.lost);
    assert_eq!(
        figures.duplicated.len(),
        1,
        "w0-1 (a retried marker is not): {:?}",
        figures.duplicated
    );
    assert_eq!(
        figures.unsent.len(),
        2,
        "w0-3 refused, stranger never sent: {:?}",
        figures.unsent
    );
}

/// The linearizability checks: a read that misses an earlier acknowledged
/// write, one that sees a later write, one that goes back, and a write
/// ordered before one acknowledged before it began are each counted.
#[test]
fn the_linearizability_checks_count_each_kind_of_violation() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    // w-d [40, 50] is ordered first (offset 0), before w-a [0, 10],
    // w-b [20, 30] and w-c [5, 15], each acknowledged before w-d began.
    let final_writes: Vec<(i64, String)> = vec![
        (0, "w-d".into()),
        (1, "w-a".into()),
        (2, "w-b".into()),
        (3, "w-c".into()),
    ];
    let history: BTreeMap<String, Outcome> = ["w-a", "w-b", "w-c", "w-d"]
        .into_iter()
        .map(|v| (v.to_string(), Outcome::Acked(String::new())))
        .collect();
    let timings: BTreeMap<String, (Instant, Instant)> = [
        ("w-a", (at(0), at(10))),
        ("w-b", (at(20), at(30))),
        ("w-c", (at(5), at(15))),
        ("w-d", (at(40), at(50))),
    ]
    .into_iter()
    .map(|(v, t)| (v.to_string(), t))
    .collect();
    let read = |invoked, completed, hw| Read {
        invoked: at(invoked),
        completed: at(completed),
        seen: Seen::HighWatermark(hw),
    };
    let reads = vec![
        read(60, 61, 4), // sees everything: fine
        read(12, 13, 1), // misses w-a (acked at 10), and sees w-d (begun at 40)
        read(70, 71, 2), // less than the read that ended at 61
    ];
    let mut figures = Figures::default();
    check_linearizable(&final_writes, &history, &timings, &reads, &mut figures);
    assert_eq!(figures.stale.len(), 2, "{:?}", figures.stale);
    assert_eq!(figures.future.len(), 1, "{:?}", figures.future);
    assert_eq!(figures.regressed.len(), 1, "{:?}", figures.regressed);
    assert_eq!(
        figures.reordered.len(),
        3,
        "w-a, w-b, w-c after w-d: {:?}",
        figures.reordered
    );
}

#[test]
fn the_prefix_checks_count_each_kind_of_inconsistency() {
    let data = |v: &str| ("data".to_string(), json!(v));
    let final_log: Records = [(0, data("a")), (1, data("b")), (2, data("c"))].into();
    let history: BTreeMap<String, Outcome> = ["a", "b", "c", "t1", "t2"]
        .into_iter()
        .map(|v| (v.to_string(), Outcome::Acked(String::new())))
        .collect();
    let topics = |offset, names: &[&str]| LocalRead::Topics {
        offset,
        topics: names.iter().map(|n| n.to_string()).collect(),
    };
    let local = vec![
        LocalRead::Log(vec![(0, data("a")), (1, data("b"))]), // a prefix: fine
        LocalRead::Log(vec![(1, data("x"))]),                 // another record at 1
        LocalRead::Log(vec![(0, data("a")), (2, data("c"))]), // a hole
        topics(5, &["t1"]),
        topics(7, &["t1", "t2"]), // fine: more topics later
        topics(7, &["t1"]),       // another image at 7
        topics(9, &["t2"]),       // lost t1, shown at 7
        topics(9, &["t2", "ghost"]),
    ];
    let mut figures = Figures::default();
    check_prefix(&final_log, &history, &local, &mut figures);
    assert_eq!(figures.local_reads, 8);
    let kinds = |needle: &str| figures.inconsistent.iter().filter(|m| m.contains(needle)).count();
    assert_eq!(kinds("the final log has"), 1, "{:?}", figures.inconsistent);
    assert_eq!(kinds("a page went from"), 1, "{:?}", figures.inconsistent);
    assert_eq!(kinds("never created"), 1, "{:?}", figures.inconsistent);
    assert_eq!(kinds("show other topics"), 2, "{:?}", figures.inconsistent);
    assert_eq!(kinds("lacks topic t1"), 1, "{:?}", figures.inconsistent);
}
