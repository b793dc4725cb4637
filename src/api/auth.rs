//! Bearer tokens for the HTTP API and the client protocol
//! (`security.tokens_file`).
//!
//! The file holds one token a line, after its scope: `read <token>` may
//! read (every `GET`, the client protocol's reads and `Quorum`), `admin
//! <token>` may also write (every other method, `Append`, `Operate`).
//! Blank lines and lines starting with `#` are skipped. A token is 16 to
//! 512 printable ASCII characters without spaces; a file with none, a
//! token given twice, or any other line is refused at start, naming the
//! file and the line.
//!
//! Without a tokens file nothing is checked: the two-command start on
//! loopback stays as it is. With one, an HTTP request without
//! `Authorization: Bearer <token>` of a listed token gets 401
//! `UNAUTHENTICATED`, a `read` token on a write gets 403
//! `CLUSTER_AUTHORIZATION_FAILED`; `GET /healthz` is open to all (a load
//! balancer's probe). A client protocol connection sends `Authenticate`
//! first, and every request before it (or after a refused one) gets the
//! same two errors. Tokens are compared in constant time.

use std::path::Path;
use std::sync::Arc;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{header, Method};
use actix_web::middleware::Next;
use actix_web::{web, ResponseError};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use crate::messages::client::ClientError;
pub use crate::messages::client::Scope;

/// Shortest token accepted in a tokens file.
pub const MIN_TOKEN_LEN: usize = 16;
/// Longest token accepted in a tokens file.
pub const MAX_TOKEN_LEN: usize = 512;
/// Largest tokens file read.
const MAX_FILE_BYTES: u64 = 1 << 20;

fn name(scope: Scope) -> &'static str {
    match scope {
        Scope::Read => "read",
        Scope::Admin => "admin",
    }
}

/// The tokens of a tokens file.
#[derive(Clone)]
pub struct Tokens {
    tokens: Vec<(Vec<u8>, Scope)>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the tokens themselves.
        f.debug_struct("Tokens").field("count", &self.tokens.len()).finish()
    }
}

/// Why a tokens file was refused.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {message}")]
pub struct TokensError {
    pub path: String,
    pub message: String,
}

impl Tokens {
    /// Reads and checks the tokens file at `path`.
    pub fn load(path: &Path) -> Result<Tokens, TokensError> {
        let error = |message: String| TokensError {
            path: path.display().to_string(),
            message,
        };
        let metadata = std::fs::metadata(path).map_err(|e| error(format!("cannot read the tokens file: {e}")))?;
        if metadata.len() > MAX_FILE_BYTES {
            return Err(error(format!(
                "the tokens file holds {} bytes; at most {MAX_FILE_BYTES} are read",
                metadata.len()
            )));
        }
        let bytes = std::fs::read(path).map_err(|e| error(format!("cannot read the tokens file: {e}")))?;
        let text = String::from_utf8(bytes).map_err(|_| error("the tokens file is not UTF-8".to_string()))?;
        Tokens::parse(&text).map_err(error)
    }

    /// Parses a tokens file's text; the error says which line is wrong.
    pub fn parse(text: &str) -> Result<Tokens, String> {
        let mut tokens: Vec<(Vec<u8>, Scope)> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(scope), Some(token), None) = (words.next(), words.next(), words.next()) else {
                return Err(format!("line {number}: expected \"read <token>\" or \"admin <token>\""));
            };
            let scope = match scope {
                "read" => Scope::Read,
                "admin" => Scope::Admin,
                _ => {
                    return Err(format!(
                        "line {number}: unknown scope {:?}; expected \"read\" or \"admin\"",
                        super::truncated(scope)
                    ))
                }
            };
            if !(MIN_TOKEN_LEN..=MAX_TOKEN_LEN).contains(&token.len()) || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "line {number}: a token is {MIN_TOKEN_LEN} to {MAX_TOKEN_LEN} printable ASCII characters, \
                     this one has {} characters",
                    token.chars().count()
                ));
            }
            if tokens.iter().any(|(known, _)| known.as_slice() == token.as_bytes()) {
                return Err(format!("line {number}: this token is listed twice"));
            }
            tokens.push((token.as_bytes().to_vec(), scope));
        }
        if tokens.is_empty() {
            return Err("the tokens file lists no token: nobody could use the API".to_string());
        }
        Ok(Tokens { tokens })
    }

    /// The first admin token listed (what `kraft snapshot` sends).
    pub fn admin_token(&self) -> Option<String> {
        self.tokens
            .iter()
            .find(|(_, scope)| *scope == Scope::Admin)
            .map(|(token, _)| String::from_utf8_lossy(token).into_owned())
    }

    /// The scope of `token`, if it is listed. Every listed token is
    /// compared, each in constant time.
    pub fn scope_of(&self, token: &[u8]) -> Option<Scope> {
        let mut found = None;
        for (known, scope) in &self.tokens {
            if bool::from(known.as_slice().ct_eq(token)) {
                found = Some(*scope);
            }
        }
        found
    }

    /// Whether a request that needs `needed` may go on with `presented`
    /// (the token, if one came).
    pub fn check(&self, presented: Option<&[u8]>, needed: Scope) -> Result<Scope, ClientError> {
        let Some(token) = presented else {
            return Err(ClientError::Unauthenticated(
                "this node requires a bearer token (security.tokens_file)".to_string(),
            ));
        };
        let Some(scope) = self.scope_of(token) else {
            return Err(ClientError::Unauthenticated("the token is not valid here".to_string()));
        };
        self.check_scope(scope, needed)
    }

    /// Whether a token of `scope` may do what needs `needed`.
    pub fn check_scope(&self, scope: Scope, needed: Scope) -> Result<Scope, ClientError> {
        if scope < needed {
            return Err(ClientError::Forbidden(format!(
                "a {} token may not do this; it needs an {} token",
                name(scope),
                name(needed)
            )));
        }
        Ok(scope)
    }
}

/// What an HTTP request needs: reads for `GET`/`HEAD`, admin otherwise.
fn needed(method: &Method) -> Scope {
    if method == Method::GET || method == Method::HEAD {
        Scope::Read
    } else {
        Scope::Admin
    }
}

/// The HTTP API's middleware: lets a request through when the node has no
/// tokens file, when it is `GET /healthz`, or when its bearer token's
/// scope allows it; answers 401 or 403 otherwise.
pub(crate) async fn authorize(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let verdict = match req.app_data::<web::Data<Arc<Tokens>>>() {
        None => Ok(()),
        Some(_) if req.path() == "/healthz" => Ok(()),
        Some(tokens) => {
            let presented = req
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|value| value.as_bytes().strip_prefix(b"Bearer "));
            tokens.check(presented, needed(req.method())).map(drop)
        }
    };
    match verdict {
        Ok(()) => next.call(req).await.map(ServiceResponse::map_into_left_body),
        Err(refusal) => {
            let response = ApiError::from(refusal).error_response();
            Ok(req.into_response(response).map_into_right_body())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADMIN: &str = "admin-token-0123456789";
    const READER: &str = "read-token-0123456789";

    fn tokens() -> Tokens {
        Tokens::parse(&format!("# comment\n\nadmin {ADMIN}\n  read {READER}  \n")).unwrap()
    }

    #[test]
    fn a_token_has_its_scope_and_an_unknown_one_none() {
        let tokens = tokens();
        assert_eq!(tokens.scope_of(ADMIN.as_bytes()), Some(Scope::Admin));
        assert_eq!(tokens.scope_of(READER.as_bytes()), Some(Scope::Read));
        assert_eq!(
            tokens.scope_of(b"admin-token-012345678"),
            None,
            "a prefix is not the token"
        );
        assert_eq!(tokens.scope_of(b""), None);
    }

    #[test]
    fn check_refuses_a_missing_or_unknown_token_and_a_read_token_on_a_write() {
        let tokens = tokens();
        assert!(matches!(
            tokens.check(None, Scope::Read),
            Err(ClientError::Unauthenticated(_))
        ));
        assert!(matches!(
            tokens.check(Some(b"nope-nope-nope-nope"), Scope::Read),
            Err(ClientError::Unauthenticated(_))
        ));
        assert_eq!(tokens.check(Some(READER.as_bytes()), Scope::Read).unwrap(), Scope::Read);
        assert!(matches!(
            tokens.check(Some(READER.as_bytes()), Scope::Admin),
            Err(ClientError::Forbidden(_))
        ));
        assert_eq!(
            tokens.check(Some(ADMIN.as_bytes()), Scope::Admin).unwrap(),
            Scope::Admin
        );
    }

    #[test]
    fn a_bad_tokens_file_is_refused_naming_the_line() {
        for (text, expected) in [
            ("", "lists no token"),
            ("# only a comment\n", "lists no token"),
            ("admin short\n", "line 1: a token is 16"),
            ("root 0123456789abcdef0\n", "line 1: unknown scope"),
            ("admin\n", "line 1: expected"),
            ("admin a b c\n", "line 1: expected"),
            (
                "admin 0123456789abcdef0\nread 0123456789abcdef0\n",
                "line 2: this token is listed twice",
            ),
            ("admin 0123456789abcdef\u{e9}\n", "line 1: a token is 16"),
        ] {
            let error = Tokens::parse(text).unwrap_err();
            assert!(error.contains(expected), "{text:?}: {error}");
        }
    }

    #[test]
    fn debug_never_shows_a_token() {
        assert!(!format!("{:?}", tokens()).contains(ADMIN));
    }
}
