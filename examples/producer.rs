//! Appends many records from many tasks over one connection
//! (`kraft::client::Producer`) and prints how fast they committed:
//!
//! ```sh
//! ./target/release/kraft run --config config.toml --set listeners.client=127.0.0.1:9092
//! cargo run --release --example producer -- 127.0.0.1:9092 100000 256
//! ```
//!
//! The arguments after the address are the records to append (default
//! 10,000, 100 bytes each, one per append) and the tasks appending them at
//! once (default 64).

use std::process::ExitCode;
use std::time::Instant;

use kraft::client::{Error, Producer};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(addr) = args.next() else {
        eprintln!("usage: producer HOST:PORT [RECORDS] [TASKS]");
        return ExitCode::from(2);
    };
    let mut number = |default: usize| args.next().map_or(Ok(default), |arg| arg.parse::<usize>());
    let (Ok(records), Ok(tasks)) = (number(10_000), number(64)) else {
        eprintln!("usage: producer HOST:PORT [RECORDS] [TASKS] (numbers)");
        return ExitCode::from(2);
    };
    match run(&addr, records, tasks.max(1)).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("producer: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(addr: &str, records: usize, tasks: usize) -> Result<(), Error> {
    let producer = Producer::connect(addr).await?;
    if records == 0 {
        return Ok(());
    }
    let started = Instant::now();
    // Each task appends every `tasks`-th record, one at a time; the
    // producer pipelines the appends of all tasks over its connection.
    let workers: Vec<_> = (0..tasks)
        .map(|task| {
            let producer = producer.clone();
            tokio::spawn(async move {
                let (mut first, mut last) = (i64::MAX, i64::MIN);
                for i in (task..records).step_by(tasks) {
                    let record = format!("{i:0>100}").into_bytes();
                    let appended = producer.append(vec![record]).await?;
                    first = first.min(appended.base_offset);
                    last = last.max(appended.last_offset);
                }
                Ok::<_, Error>((first, last))
            })
        })
        .collect();
    let (mut first, mut last) = (i64::MAX, i64::MIN);
    for worker in workers {
        let (from, to) = worker.await.expect("an appending task panicked")?;
        first = first.min(from);
        last = last.max(to);
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{records} records committed in {secs:.2} s ({:.0} records/s) from {tasks} tasks over one connection, offsets {first}..={last}",
        records as f64 / secs
    );
    Ok(())
}
