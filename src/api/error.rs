//! Every error the HTTP API returns, and its JSON body.
//!
//! Each body is an object with an `error` code (upper-case, stable, meant
//! for programs) and, where there is something to say, a `message` (for
//! people). `NOT_LEADER` also carries `leader_id` (null when no leader is
//! known) and `leader_endpoint`, so a client can go to the leader itself.
//!
//! A request's own errors are the client protocol's [`ClientError`]: the
//! same cases, with the same codes, whichever way a request came.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

use crate::messages::client::ClientError;
use crate::node::{AppendError, ControllerError, NodeError};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The request was refused or failed; see [`ClientError`] for what was
    /// written in each case.
    #[error(transparent)]
    Request(#[from] ClientError),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("method not allowed: {0}")]
    MethodNotAllowed(String),
}

/// A metadata operation or read refused, with Kafka's error name.
impl From<ControllerError> for ApiError {
    fn from(err: ControllerError) -> Self {
        ApiError::Request(ClientError::Controller(err))
    }
}

impl ApiError {
    /// The stable code in the body's `error` field.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Request(err) => err.code(),
            ApiError::NotFound(_) => "NOT_FOUND",
            ApiError::MethodNotAllowed(_) => "METHOD_NOT_ALLOWED",
        }
    }

    /// Malformed JSON, the wrong shape, an empty record list, bad query
    /// parameters. Nothing was written.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ClientError::BadRequest(message.into()).into()
    }

    /// A body larger than the batch cap (`log.max_batch_bytes`).
    pub fn payload_too_large(message: impl Into<String>) -> ApiError {
        ClientError::PayloadTooLarge(message.into()).into()
    }

    /// The node refused the request as invalid (e.g. a batch over the cap).
    pub fn rejected(message: impl Into<String>) -> ApiError {
        ClientError::Rejected(message.into()).into()
    }

    /// The node is shutting down or overloaded.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ClientError::Unavailable(message.into()).into()
    }
}

impl From<AppendError> for ApiError {
    fn from(err: AppendError) -> Self {
        ApiError::Request(err.into())
    }
}

impl From<NodeError> for ApiError {
    fn from(err: NodeError) -> Self {
        ApiError::unavailable(err.reason())
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Request(ClientError::BadRequest(_) | ClientError::Rejected(_) | ClientError::Unsupported(_)) => {
                StatusCode::BAD_REQUEST
            }
            ApiError::Request(ClientError::PayloadTooLarge(_)) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Request(ClientError::NotLeader { .. } | ClientError::Unavailable(_)) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            // 500 rather than 504: proxies and client libraries retry 502-504
            // on their own, and a write of unknown outcome must not be
            // replayed behind the caller's back.
            ApiError::Request(ClientError::OutcomeUnknown(_)) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Request(ClientError::Unauthenticated(_)) => StatusCode::UNAUTHORIZED,
            ApiError::Request(ClientError::Forbidden(_)) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Request(ClientError::Controller(err)) => match err {
                ControllerError::TopicAlreadyExists(_)
                | ControllerError::StaleBrokerEpoch(_)
                | ControllerError::DuplicateBrokerRegistration(_)
                | ControllerError::FencedLeaderEpoch(_)
                | ControllerError::InvalidUpdateVersion(_)
                | ControllerError::NotLeaderOrFollower(_)
                | ControllerError::PreferredLeaderNotAvailable(_) => StatusCode::CONFLICT,
                ControllerError::UnknownTopicOrPartition(_) | ControllerError::BrokerIdNotRegistered(_) => {
                    StatusCode::NOT_FOUND
                }
                ControllerError::NotController { .. } | ControllerError::Unavailable(_) => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                ControllerError::OutcomeUnknown(_) => StatusCode::INTERNAL_SERVER_ERROR,
                _ => StatusCode::BAD_REQUEST,
            },
        }
    }

    fn error_response(&self) -> HttpResponse {
        let body = match self {
            ApiError::Request(
                err @ ClientError::NotLeader {
                    leader_id,
                    leader_endpoint,
                },
            ) => json!({
                "error": self.code(),
                "message": err.to_string(),
                "leader_id": leader_id,
                "leader_endpoint": leader_endpoint,
            }),
            ApiError::Request(ClientError::Controller(ControllerError::NotController { leader_id, message })) => {
                json!({
                    "error": self.code(),
                    "message": message,
                    "leader_id": leader_id,
                })
            }
            ApiError::Request(ClientError::Controller(err)) => json!({
                "error": self.code(),
                "message": err.message(),
            }),
            ApiError::Request(
                ClientError::BadRequest(message)
                | ClientError::PayloadTooLarge(message)
                | ClientError::OutcomeUnknown(message)
                | ClientError::Rejected(message)
                | ClientError::Unavailable(message)
                | ClientError::Unsupported(message)
                | ClientError::Unauthenticated(message)
                | ClientError::Forbidden(message),
            )
            | ApiError::NotFound(message)
            | ApiError::MethodNotAllowed(message) => json!({
                "error": self.code(),
                "message": message,
            }),
        };
        let mut response = HttpResponse::build(self.status_code());
        if matches!(self, ApiError::Request(ClientError::Unauthenticated(_))) {
            response.insert_header((actix_web::http::header::WWW_AUTHENTICATE, "Bearer"));
        }
        response.json(body)
    }
}
