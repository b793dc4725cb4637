//! The broker side of a node in metadata mode (`node.roles` holds
//! `"broker"`; with `"controller"` too, Kafka's combined mode): it registers
//! itself with the active controller (a new incarnation id per start, its
//! `listeners.advertised`, its `broker.rack`), heartbeats every
//! `broker.heartbeat_interval_ms` with how far its own image has replayed
//! the log, so that the controller unfences it once it has caught up to its
//! registration, registers again when the controller no longer knows its
//! epoch, and on shutdown asks for a controlled shutdown (its partitions'
//! leadership moves away) before the node stops. Operations go through
//! [`NodeHandle::operate`], so they reach the active controller from any
//! node.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{debug, info, warn};

use crate::config::Config;
use crate::metadata::controller::{BrokerRegistrationRequest, ControllerError};
use crate::metadata::records::BrokerEndpoint;
use crate::node::{NodeHandle, Operation};

/// How soon a registration that failed is tried again.
const REGISTER_RETRY: Duration = Duration::from_millis(200);

/// What the broker side shares with its node's handle.
pub(crate) struct BrokerSide {
    registration: BrokerRegistrationRequest,
    heartbeat_interval: Duration,
    session_timeout: Duration,
    /// The epoch of the current registration.
    epoch: Mutex<Option<i64>>,
    /// The node is shutting down: heartbeats stop (controlled shutdown
    /// takes over).
    stopping: AtomicBool,
}

impl BrokerSide {
    /// `seed` makes the incarnation id (a node's seed differs per start).
    pub(crate) fn new(config: &Config, http_addr: std::net::SocketAddr, seed: u64) -> BrokerSide {
        let listeners = if config.listeners.advertised.is_empty() {
            vec![BrokerEndpoint {
                name: "PLAINTEXT".to_string(),
                host: http_addr.ip().to_string(),
                port: http_addr.port(),
                security_protocol: 0,
            }]
        } else {
            config
                .listeners
                .advertised
                .iter()
                .map(|l| BrokerEndpoint {
                    name: l.name.clone(),
                    host: l.host.clone(),
                    port: l.port,
                    security_protocol: ["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
                        .iter()
                        .position(|p| *p == l.name)
                        .unwrap_or(0) as i16,
                })
                .collect()
        };
        BrokerSide {
            registration: BrokerRegistrationRequest {
                broker_id: config.node.id,
                incarnation_id: {
                    use rand::{Rng, SeedableRng};
                    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
                    uuid::Builder::from_random_bytes(rng.gen()).into_uuid()
                },
                listeners,
                rack: config.broker.rack.clone(),
                features: crate::metadata::controller::supported_features(),
            },
            heartbeat_interval: Duration::from_millis(config.broker.heartbeat_interval_ms),
            session_timeout: Duration::from_millis(config.broker.session_timeout_ms),
            epoch: Mutex::new(None),
            stopping: AtomicBool::new(false),
        }
    }

    fn epoch(&self) -> Option<i64> {
        *self.epoch.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_epoch(&self, epoch: Option<i64>) {
        *self.epoch.lock().unwrap_or_else(|e| e.into_inner()) = epoch;
    }

    fn heartbeat(&self, node: &NodeHandle, epoch: i64, want_shutdown: bool) -> Operation {
        Operation::BrokerHeartbeat {
            broker_id: self.registration.broker_id,
            broker_epoch: epoch,
            metadata_offset: node.metadata_image().map_or(-1, |image| image.offset),
            want_fence: false,
            want_shutdown,
        }
    }
}

/// Registers and heartbeats until the node stops or begins to shut down.
pub(crate) async fn run(node: NodeHandle, side: Arc<BrokerSide>) {
    let id = side.registration.broker_id;
    while !node.is_stopped() && !side.stopping.load(Ordering::Relaxed) {
        let Some(epoch) = side.epoch() else {
            match node.operate(Operation::RegisterBroker(side.registration.clone())).await {
                Ok(answer) => {
                    info!(
                        broker = id,
                        epoch = answer.broker_epoch,
                        "registered with the controller"
                    );
                    side.set_epoch(answer.broker_epoch);
                }
                Err(e) => {
                    debug!(broker = id, "registration not taken yet: {e}");
                    tokio::time::sleep(REGISTER_RETRY).await;
                }
            }
            continue;
        };
        match node.operate(side.heartbeat(&node, epoch, false)).await {
            Ok(_) => {}
            Err(ControllerError::StaleBrokerEpoch(_) | ControllerError::BrokerIdNotRegistered(_)) => {
                warn!(
                    broker = id,
                    epoch, "the controller no longer knows this registration; registering again"
                );
                side.set_epoch(None);
                continue;
            }
            Err(e) => debug!(broker = id, "heartbeat not taken: {e}"),
        }
        tokio::time::sleep(side.heartbeat_interval).await;
    }
}

/// Asks the controller for a controlled shutdown and waits until it says
/// the broker may stop (its partitions are led elsewhere), for at most a
/// session timeout.
pub(crate) async fn controlled_shutdown(node: &NodeHandle, side: &BrokerSide) {
    side.stopping.store(true, Ordering::Relaxed);
    let Some(epoch) = side.epoch() else { return };
    let id = side.registration.broker_id;
    let deadline = tokio::time::Instant::now() + side.session_timeout;
    info!(broker = id, "asking the controller for a controlled shutdown");
    while tokio::time::Instant::now() < deadline {
        match node.operate(side.heartbeat(node, epoch, true)).await {
            Ok(answer) if answer.heartbeat.is_some_and(|h| h.should_shut_down) => {
                info!(broker = id, "the controller moved this broker's partitions; stopping");
                return;
            }
            Ok(_) => {}
            Err(ControllerError::StaleBrokerEpoch(_) | ControllerError::BrokerIdNotRegistered(_)) => return,
            Err(e) => debug!(broker = id, "controlled shutdown not taken yet: {e}"),
        }
        tokio::time::sleep(side.heartbeat_interval.min(Duration::from_millis(500))).await;
    }
    warn!(
        broker = id,
        "no controlled shutdown within the session timeout; stopping anyway"
    );
}
