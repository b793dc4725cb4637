//! Every error the HTTP API returns, and its JSON body.
//!
//! Each body is an object with an `error` code (upper-case, stable, meant
//! for programs) and, where there is something to say, a `message` (for
//! people). `NOT_LEADER` also carries `leader_id` (null when no leader is
//! known) and `leader_endpoint`, so a client can go to the leader itself.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

use crate::node::{AppendError, NodeError};
use crate::raft::NodeId;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Malformed JSON, the wrong shape, an empty record list, bad query
    /// parameters. Nothing was written.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The body is larger than the batch cap (`log.max_batch_bytes`).
    #[error("payload too large: {0}")]
    PayloadTooLarge(String),
    /// No leader is known, or it could not be reached. Nothing was written.
    #[error("not the leader; leader is {leader_id:?}")]
    NotLeader {
        leader_id: Option<NodeId>,
        leader_endpoint: Option<String>,
    },
    /// The records were handed to a leader that was lost before they
    /// committed: they may or may not be in the log. Never reported as a
    /// success and never retried here.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// The node refused the request as invalid (e.g. a batch over the cap).
    #[error("rejected: {0}")]
    Rejected(String),
    /// The node is shutting down or has failed.
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("method not allowed: {0}")]
    MethodNotAllowed(String),
}

impl ApiError {
    /// The stable code in the body's `error` field.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "BAD_REQUEST",
            ApiError::PayloadTooLarge(_) => "PAYLOAD_TOO_LARGE",
            ApiError::NotLeader { .. } => "NOT_LEADER",
            ApiError::OutcomeUnknown(_) => "OUTCOME_UNKNOWN",
            ApiError::Rejected(_) => "REJECTED",
            ApiError::Unavailable(_) => "UNAVAILABLE",
            ApiError::NotFound(_) => "NOT_FOUND",
            ApiError::MethodNotAllowed(_) => "METHOD_NOT_ALLOWED",
        }
    }
}

impl From<AppendError> for ApiError {
    fn from(err: AppendError) -> Self {
        match err {
            AppendError::NotLeader {
                leader_id,
                leader_endpoint,
            } => ApiError::NotLeader {
                leader_id,
                leader_endpoint,
            },
            AppendError::OutcomeUnknown(message) => ApiError::OutcomeUnknown(message),
            AppendError::Rejected(message) => ApiError::Rejected(message),
            AppendError::Unavailable(message) => ApiError::Unavailable(message),
        }
    }
}

impl From<NodeError> for ApiError {
    fn from(err: NodeError) -> Self {
        ApiError::Unavailable(err.0)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::Rejected(_) => StatusCode::BAD_REQUEST,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::NotLeader { .. } | ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            // 500 rather than 504: proxies and client libraries retry 502-504
            // on their own, and a write of unknown outcome must not be
            // replayed behind the caller's back.
            ApiError::OutcomeUnknown(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let body = match self {
            ApiError::NotLeader {
                leader_id,
                leader_endpoint,
            } => json!({
                "error": self.code(),
                "message": self.to_string(),
                "leader_id": leader_id,
                "leader_endpoint": leader_endpoint,
            }),
            ApiError::BadRequest(message)
            | ApiError::PayloadTooLarge(message)
            | ApiError::OutcomeUnknown(message)
            | ApiError::Rejected(message)
            | ApiError::Unavailable(message)
            | ApiError::NotFound(message)
            | ApiError::MethodNotAllowed(message) => json!({
                "error": self.code(),
                "message": message,
            }),
        };
        HttpResponse::build(self.status_code()).json(body)
    }
}
