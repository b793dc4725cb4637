//! One HTTP/1.1 keep-alive connection (hyper), owned by one client: exactly
//! one TCP connection per client, re-opened only after it broke.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

pub struct HttpConn {
    addr: SocketAddr,
    sender: Option<SendRequest<Full<Bytes>>>,
    /// Connections opened, the first one included.
    pub connects: u64,
}

impl HttpConn {
    /// A connection to `addr`, opened on the first request.
    pub fn new(addr: SocketAddr) -> HttpConn {
        HttpConn {
            addr,
            sender: None,
            connects: 0,
        }
    }

    async fn sender(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, String> {
        if self.sender.as_ref().is_none_or(|s| s.is_closed()) {
            let stream = TcpStream::connect(self.addr)
                .await
                .map_err(|e| format!("connect {}: {e}", self.addr))?;
            stream.set_nodelay(true).map_err(|e| format!("set_nodelay: {e}"))?;
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| format!("http handshake with {}: {e}", self.addr))?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            self.sender = Some(sender);
            self.connects += 1;
        }
        let sender = self.sender.as_mut().expect("just set");
        sender
            .ready()
            .await
            .map_err(|e| format!("connection to {}: {e}", self.addr))?;
        Ok(sender)
    }

    /// Sends one request and reads the whole answer. A transport error drops
    /// the connection (the next request opens a new one).
    pub async fn send(&mut self, method: Method, path: &str, body: Bytes) -> Result<(StatusCode, Bytes), String> {
        let host = self.addr.to_string();
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, host)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .map_err(|e| format!("build request: {e}"))?;
        let result = async {
            let response = self
                .sender()
                .await?
                .send_request(request)
                .await
                .map_err(|e| format!("{path}: {e}"))?;
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| format!("{path}: reading the answer: {e}"))?
                .to_bytes();
            Ok((status, body))
        }
        .await;
        if result.is_err() {
            self.sender = None;
        }
        result
    }

    pub async fn get(&mut self, path: &str) -> Result<(StatusCode, Bytes), String> {
        self.send(Method::GET, path, Bytes::new()).await
    }

    pub async fn post(&mut self, path: &str, body: Bytes) -> Result<(StatusCode, Bytes), String> {
        self.send(Method::POST, path, body).await
    }
}
