//! A 3-server ZooKeeper ensemble (Debian's `zookeeper` package, started as
//! `java ... QuorumPeerMain zoo.cfg`) on 127.0.0.1, and the client that
//! writes to its leader.
//!
//! Every port is on 127.0.0.1 (`clientPortAddress`, and the quorum and
//! election addresses of `server.N`); the AdminServer is off, client
//! connections are unlimited, and only the `srvr` and `stat` four-letter
//! words are allowed. The leader is the server whose `srvr` answer says
//! `Mode: leader`; every client opens its own session on that server only.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use zookeeper_client::{Acls, Client, CreateMode};

use crate::load;
use crate::procs::{self, ProcessGuard};

const LEADER_WAIT: Duration = Duration::from_secs(60);
const SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// ZooKeeper's jar as Debian installs it; its manifest names its
/// dependencies under /usr/share/java.
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
/// An SLF4J binding, so the servers log to their stdout.
const LOGGING_JARS: [&str; 2] = ["/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar"];
const LOG4J_CONFIG: &str = "/etc/zookeeper/conf/log4j.properties";
/// Heap of each server (the JVM default would be a quarter of the machine).
const HEAP: &str = "-Xmx1g";

/// The Java runtime and classpath for a ZooKeeper server.
pub struct Installation {
    java: PathBuf,
    classpath: String,
}

pub fn locate() -> Result<Installation> {
    let missing = || anyhow!("ZooKeeper not installed: run scripts/install-bench-peers.sh");
    if !Path::new(ZOOKEEPER_JAR).is_file() {
        return Err(missing()).context(format!("{ZOOKEEPER_JAR} is missing"));
    }
    let java = procs::which("java")
        .ok_or_else(missing)
        .context("java is not on PATH")?;
    let mut classpath = vec![ZOOKEEPER_JAR];
    classpath.extend(LOGGING_JARS.iter().filter(|jar| Path::new(jar).is_file()));
    Ok(Installation {
        java,
        classpath: classpath.join(":"),
    })
}

/// A running 3-server ensemble; dropping it stops the servers, then removes
/// the data directories.
pub struct ZkEnsemble {
    processes: ProcessGuard,
    /// Client addresses, server 1 to 3.
    pub clients: Vec<SocketAddr>,
    _dir: tempfile::TempDir,
}

impl ZkEnsemble {
    pub fn start(installation: &Installation, data_root: &Path) -> Result<ZkEnsemble> {
        let dir = procs::data_dir(data_root, "kraft-bench-zookeeper-")?;
        let ports = procs::free_ports(9)?;
        let servers = (0..3)
            .map(|i| format!("server.{}=127.0.0.1:{}:{}\n", i + 1, ports[3 + i], ports[6 + i]))
            .collect::<String>();
        let mut processes = ProcessGuard::default();
        for (i, client_port) in ports[..3].iter().enumerate() {
            let id = i + 1;
            let data_dir = dir.path().join(format!("zk{id}"));
            std::fs::create_dir_all(&data_dir)?;
            std::fs::write(data_dir.join("myid"), format!("{id}\n"))?;
            let config = dir.path().join(format!("zoo{id}.cfg"));
            std::fs::write(&config, zoo_cfg(&data_dir, *client_port, &servers))
                .with_context(|| format!("cannot write {}", config.display()))?;
            let mut command = Command::new(&installation.java);
            command
                .arg(HEAP)
                .arg("-Djava.net.preferIPv4Stack=true")
                .arg(format!("-Dzookeeper.log.dir={}", dir.path().display()))
                .arg("-Dzookeeper.root.logger=INFO,CONSOLE")
                .arg(format!("-Dlog4j.configuration=file:{LOG4J_CONFIG}"))
                .arg("-cp")
                .arg(&installation.classpath)
                .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
                .arg(&config);
            processes.spawn(
                &format!("zookeeper {id}"),
                command,
                &dir.path().join(format!("zk{id}.log")),
            )?;
        }
        Ok(ZkEnsemble {
            processes,
            clients: ports[..3]
                .iter()
                .map(|port| SocketAddr::from(([127, 0, 0, 1], *port)))
                .collect(),
            _dir: dir,
        })
    }

    pub fn pids(&self) -> Vec<u32> {
        self.processes.pids()
    }

    /// Waits until one server is leader and the two others followers;
    /// returns the leader's client address.
    pub async fn wait_for_leader(&mut self) -> Result<SocketAddr> {
        let deadline = tokio::time::Instant::now() + LEADER_WAIT;
        let mut last = String::from("no answer yet");
        loop {
            self.processes.check_running()?;
            let mut modes = Vec::new();
            for addr in &self.clients {
                match mode(*addr).await {
                    Ok(mode) => modes.push(mode),
                    Err(e) => {
                        last = format!("{addr}: {e}");
                        modes.push(String::new());
                    }
                }
            }
            let leaders: Vec<usize> = (0..3).filter(|&i| modes[i] == "leader").collect();
            let followers = modes.iter().filter(|m| *m == "follower").count();
            if leaders.len() == 1 && followers == 2 {
                return Ok(self.clients[leaders[0]]);
            }
            if modes.iter().any(|m| !m.is_empty()) {
                last = format!("modes: {modes:?}");
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "zookeeper: no leader after {LEADER_WAIT:?} ({last})\n{}",
                    self.processes.log_tails(10)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn zoo_cfg(data_dir: &Path, client_port: u16, servers: &str) -> String {
    format!(
        "# Written by kraft-bench for one benchmark run.\n\
         tickTime=2000\n\
         initLimit=10\n\
         syncLimit=5\n\
         dataDir={data_dir}\n\
         clientPort={client_port}\n\
         clientPortAddress=127.0.0.1\n\
         maxClientCnxns=0\n\
         admin.enableServer=false\n\
         4lw.commands.whitelist=srvr,stat\n\
         {servers}",
        data_dir = data_dir.display(),
    )
}

/// The `Mode:` line of a server's `srvr` answer (leader, follower, ...).
async fn mode(addr: SocketAddr) -> Result<String> {
    let mut stream = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr)).await??;
    stream.write_all(b"srvr").await?;
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(2), stream.read_to_string(&mut answer)).await??;
    answer
        .lines()
        .find_map(|line| line.strip_prefix("Mode: "))
        .map(|mode| mode.trim().to_string())
        .ok_or_else(|| anyhow!("no Mode in srvr answer: {answer:?}"))
}

async fn session(addr: SocketAddr) -> Result<Client> {
    let client = Client::connector()
        .with_session_timeout(SESSION_TIMEOUT)
        .with_server_version(3, 8, 0)
        .connect(&addr.to_string())
        .await
        .with_context(|| format!("zookeeper session on {addr}"))?;
    Ok(client)
}

/// Creates `/bench` and one znode per client on the leader.
pub async fn create_znodes(leader: SocketAddr, clients: usize, value_bytes: usize) -> Result<()> {
    let client = session(leader).await?;
    let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
    client.create("/bench", b"", &options).await.context("create /bench")?;
    for id in 0..clients {
        let value = load::payload(id, 0, value_bytes);
        client
            .create(&znode(id), value.as_bytes(), &options)
            .await
            .with_context(|| format!("create {}", znode(id)))?;
    }
    Ok(())
}

fn znode(client: usize) -> String {
    format!("/bench/c{client:05}")
}

/// One closed-loop client: its own session (one connection) on the leader,
/// `setData` of its own znode per request.
pub struct SetDataClient {
    client: Client,
    path: String,
    id: usize,
    seq: u64,
    value_bytes: usize,
}

impl SetDataClient {
    pub async fn connect(leader: SocketAddr, id: usize, value_bytes: usize) -> Result<SetDataClient> {
        Ok(SetDataClient {
            client: session(leader)
                .await
                .with_context(|| format!("zookeeper client {id}"))?,
            path: znode(id),
            id,
            seq: 0,
            value_bytes,
        })
    }
}

impl load::Client for SetDataClient {
    async fn request(&mut self) -> Result<u64, String> {
        self.seq += 1;
        let value = load::payload(self.id, self.seq, self.value_bytes);
        self.client
            .set_data(&self.path, value.as_bytes(), None)
            .await
            .map(|_| 1)
            .map_err(|e| format!("zookeeper setData: {e}"))
    }
}
