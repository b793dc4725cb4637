//! Embedding a single-node kraft quorum in an actix application:
//! start it, register a listener, append, read the committed log, stop.
//!
//! `cargo run --example embed`

use std::collections::BTreeMap;
use std::time::Duration;

use actix::prelude::*;
use kraft::config::Config;
use kraft::node::{self, Committed, LeaderChanged, Listener};

/// Prints what the quorum commits.
struct Printer;

impl Actor for Printer {
    type Context = Context<Self>;
}

impl Handler<Committed> for Printer {
    type Result = ();

    fn handle(&mut self, msg: Committed, _ctx: &mut Self::Context) {
        for r in msg.records {
            println!("listener: offset {} (epoch {}): {:?}", r.offset, r.epoch, r.record);
        }
    }
}

impl Handler<LeaderChanged> for Printer {
    type Result = ();

    fn handle(&mut self, msg: LeaderChanged, _ctx: &mut Self::Context) {
        println!("listener: leader is {:?} in epoch {}", msg.leader_id, msg.epoch);
    }
}

#[actix_rt::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let data_dir = tempfile::tempdir()?;
    let mut config = Config::default();
    // A replicated log of raw records (the default is the metadata image).
    config.node.state_machine = kraft::config::StateMachineKind::Log;
    config.node.roles = vec![kraft::config::NodeRole::Controller];
    config.node.data_dir = data_dir.path().to_path_buf();
    // Port 0: let the OS pick; a single voter never dials itself.
    config.listeners.raft = "127.0.0.1:0".parse()?;
    config.quorum.voters = BTreeMap::from([(1, "127.0.0.1:0".to_string())]);

    let node = node::start(config).await?;
    println!(
        "node {} listening for raft peers on {}",
        node.node_id(),
        node.raft_addr()
    );

    let printer = Printer.start();
    node.register_listener(Listener {
        committed: printer.clone().recipient(),
        leader_changed: Some(printer.recipient()),
        load_snapshot: None,
    })
    .await?;

    // A single voter elects itself while it starts.
    let appended = node.append(vec![b"hello".to_vec(), b"world".to_vec()]).await?;
    println!(
        "committed at offsets {}..={} in epoch {}",
        appended.base_offset, appended.last_offset, appended.epoch
    );

    let page = node.read_committed(0, 100).await?;
    for entry in &page.records {
        println!("log: offset {} {} {:?}", entry.offset, entry.kind, entry.value);
    }
    let status = node.describe().await?;
    println!(
        "role {} epoch {} high watermark {}",
        status.role, status.leader_epoch, status.high_watermark
    );

    // Give the listener a moment to print, then stop gracefully.
    tokio::time::sleep(Duration::from_millis(100)).await;
    node.shutdown().await;
    Ok(())
}
