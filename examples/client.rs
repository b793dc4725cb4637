//! Appends records through a node's client listener, prints where they
//! landed and reads them back:
//!
//! ```sh
//! ./target/release/kraft run --config config.toml --set listeners.client=127.0.0.1:9092
//! cargo run --release --example client -- 127.0.0.1:9092 hello world
//! ```

use kraft::client::{Client, ClientError, Error};
use kraft::messages::Record;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(addr) = args.next() else {
        eprintln!("usage: client HOST:PORT RECORD...");
        return std::process::ExitCode::from(2);
    };
    let records: Vec<Vec<u8>> = args.map(String::into_bytes).collect();
    match run(&addr, records).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("client: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(addr: &str, records: Vec<Vec<u8>>) -> Result<(), Error> {
    let mut client = Client::connect(addr).await?;
    let status = client.quorum().await?;
    println!(
        "node {} is {} (leader {:?}, epoch {}, high watermark {})",
        status.node_id, status.role, status.leader_id, status.leader_epoch, status.high_watermark
    );
    if records.is_empty() {
        return Ok(());
    }
    match client.append(records).await {
        Ok(appended) => {
            println!(
                "committed at offsets {}..={} in epoch {}",
                appended.base_offset, appended.last_offset, appended.epoch
            );
            // Read them back, as the log holds them.
            let count = u32::try_from(appended.last_offset - appended.base_offset + 1).unwrap_or(u32::MAX);
            for committed in client.read(appended.base_offset, count).await?.records {
                match committed.record {
                    Record::Data(bytes) => println!("  {}: {:?}", committed.offset, String::from_utf8_lossy(&bytes)),
                    other => println!("  {}: {}", committed.offset, other.kind()),
                }
            }
            Ok(())
        }
        // No leader yet (just started): the caller may try again.
        Err(Error::Node(ClientError::NotLeader { leader_id, .. })) => {
            println!("no leader to take the records yet (leader {leader_id:?}); try again");
            Ok(())
        }
        Err(err) => Err(err),
    }
}
