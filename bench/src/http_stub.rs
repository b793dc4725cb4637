//! The HTTP ceiling: what the load generator reaches against an actix-web
//! server that answers `POST /v1/append` at once, with no quorum and no disk.
//!
//! kraft's leader serves its API with actix-web's HTTP/1 service on one
//! thread (by default the node's own, `listeners.http_workers = 0`; with 1,
//! on one worker thread). This stub does its HTTP work on one thread too:
//! actix-web 4 with one worker, the same JSON body decoded with the same
//! `deny_unknown_fields` rule, an answer of the same shape (`base_offset`,
//! `last_offset`, `epoch`). Driven by the same clients as kraft, its ops/s is the most
//! kraft's HTTP API could give on this machine in the same run, and
//! kraft's ops/s over it is the share of that ceiling the quorum leaves.
//!
//! The harness runs the stub as its own process (this binary's hidden
//! `http-stub` command), so its CPU is counted apart from the load
//! generator's, as a kraft node's is.

use std::cell::Cell;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use actix_web::{web, App, HttpResponse, HttpServer};
use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::procs::{self, ProcessGuard};

/// Longest wait for the stub to accept connections.
const READY_WAIT: Duration = Duration::from_secs(10);

/// The body kraft's `POST /v1/append` takes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendRequest {
    records: Vec<String>,
}

thread_local! {
    /// The next offset handed out; one worker, so one counter.
    static NEXT_OFFSET: Cell<u64> = const { Cell::new(0) };
}

async fn append(body: web::Json<AppendRequest>) -> HttpResponse {
    let count = body.records.len() as u64;
    if count == 0 {
        return HttpResponse::BadRequest()
            .json(serde_json::json!({ "error": "records must hold at least one record" }));
    }
    let base = NEXT_OFFSET.with(|next| {
        let base = next.get();
        next.set(base + count);
        base
    });
    HttpResponse::Ok().json(serde_json::json!({
        "base_offset": base,
        "last_offset": base + count - 1,
        "epoch": 1,
    }))
}

fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/append", web::post().to(append));
}

/// Serves until killed (the hidden `http-stub` command).
pub fn serve(listen: SocketAddr) -> Result<()> {
    actix_rt::System::new().block_on(async move {
        HttpServer::new(|| App::new().configure(routes))
            .workers(1)
            .bind(listen)
            .with_context(|| format!("cannot listen on {listen}"))?
            .run()
            .await
            .context("the stub server failed")
    })
}

/// A running stub process; dropping it stops the process.
pub struct StubServer {
    processes: ProcessGuard,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl StubServer {
    /// Starts `<this binary> http-stub --listen 127.0.0.1:PORT` on a free
    /// port, its log in a fresh directory under `data_root`.
    pub fn start(data_root: &Path) -> Result<StubServer> {
        let dir = procs::data_dir(data_root, "kraft-bench-stub-")?;
        let port = procs::free_ports(1)?[0];
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let exe = std::env::current_exe().context("cannot find this benchmark's own binary")?;
        let mut command = Command::new(exe);
        command.arg("http-stub").arg("--listen").arg(addr.to_string());
        let mut processes = ProcessGuard::default();
        processes.spawn("http-stub", command, &dir.path().join("stub.log"))?;
        Ok(StubServer {
            processes,
            addr,
            _dir: dir,
        })
    }

    /// Waits until the stub accepts a connection.
    pub async fn wait_ready(&mut self) -> Result<SocketAddr> {
        let deadline = tokio::time::Instant::now() + READY_WAIT;
        loop {
            self.processes.check_running()?;
            if tokio::net::TcpStream::connect(self.addr).await.is_ok() {
                return Ok(self.addr);
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "the HTTP stub did not listen on {} within {READY_WAIT:?}:\n{}",
                    self.addr,
                    self.processes.log_tails(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn pids(&self) -> Vec<u32> {
        self.processes.pids()
    }
}

#[cfg(test)]
mod tests {
    use actix_web::http::StatusCode;
    use actix_web::test;

    use super::*;

    /// One request to a fresh app on this test's thread (the offset counter
    /// is per thread, so it carries over between calls of one test).
    async fn post(body: &str) -> (StatusCode, serde_json::Value) {
        let app = test::init_service(App::new().configure(routes)).await;
        let request = test::TestRequest::post()
            .uri("/v1/append")
            .insert_header(("content-type", "application/json"))
            .set_payload(body.to_owned())
            .to_request();
        let response = test::call_service(&app, request).await;
        let status = response.status();
        let bytes = test::read_body(response).await;
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        )
    }

    #[actix_rt::test]
    async fn answers_like_kraft_with_consecutive_offsets() {
        let (status, answer) = post(r#"{"records":["a","b"]}"#).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            answer,
            serde_json::json!({"base_offset": 0, "last_offset": 1, "epoch": 1})
        );
        let (_, answer) = post(r#"{"records":["c"]}"#).await;
        assert_eq!(answer["base_offset"], 2);
        assert_eq!(answer["last_offset"], 2);
    }

    #[actix_rt::test]
    async fn refuses_what_kraft_refuses() {
        assert_eq!(post(r#"{"records":[]}"#).await.0, StatusCode::BAD_REQUEST);
        assert_eq!(post(r#"{"records":["a"],"extra":1}"#).await.0, StatusCode::BAD_REQUEST);
        assert_eq!(post("not json").await.0, StatusCode::BAD_REQUEST);
    }
}
