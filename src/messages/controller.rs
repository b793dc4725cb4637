//! Controller operations as they travel: forwarded from any node to the
//! active controller (inside the raft listener's `Controller` request), and
//! sent by clients of the client protocol. The rules that run them are in
//! `crate::metadata::controller`; the actor that runs them is
//! `crate::actors::controller`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::codec;
use crate::metadata::controller::{BrokerRegistrationRequest, ConfigChange, ControllerError, IsrChange, NewTopic};
use crate::metadata::records::BrokerId;
use crate::types::Offset;

/// What an operation asks the controller to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operation {
    /// Register a broker (a new incarnation fences the old one); answered
    /// with its broker epoch.
    RegisterBroker(BrokerRegistrationRequest),
    /// A broker's heartbeat; answered with a [`HeartbeatAnswer`].
    BrokerHeartbeat {
        broker_id: BrokerId,
        broker_epoch: i64,
        /// The offset of the broker's own image.
        metadata_offset: Offset,
        want_fence: bool,
        want_shutdown: bool,
    },
    UnregisterBroker {
        broker_id: BrokerId,
    },
    CreateTopic(NewTopic),
    DeleteTopic {
        name: String,
    },
    /// Grow a topic to `count` partitions in all.
    CreatePartitions {
        name: String,
        count: i32,
    },
    /// Set and delete configs of a resource: `resource_type` 2 is a topic,
    /// 4 a broker (`name` "" is the cluster default), as Kafka's.
    AlterConfigs {
        resource_type: i8,
        name: String,
        change: ConfigChange,
    },
    /// Finalized feature levels to set (0 removes a feature).
    UpdateFeatures {
        levels: BTreeMap<String, i16>,
    },
    /// ISR changes from partitions' leader (AlterPartition); answered with
    /// a refusal, or none, per change.
    AlterPartitions {
        broker_id: BrokerId,
        broker_epoch: i64,
        changes: Vec<IsrChange>,
    },
    /// Make a partition's preferred replica its leader.
    ElectPreferred {
        topic: String,
        partition: i32,
    },
    /// The controller's own: fence a broker whose session expired, unless
    /// it was heard from since. Refused from clients.
    FenceExpired {
        broker_id: BrokerId,
        broker_epoch: i64,
    },
}

/// What a heartbeat answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatAnswer {
    pub is_fenced: bool,
    /// The broker's image has reached its registration.
    pub is_caught_up: bool,
    /// The broker asked to shut down and leads no partition any more.
    pub should_shut_down: bool,
}

/// A committed operation's answer as it travels: the offset the
/// controller's image reflected once the operation committed (a node whose
/// image reaches it shows the result), and what the operation returns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationAnswer {
    pub offset: Offset,
    /// A registration's broker epoch.
    pub broker_epoch: Option<i64>,
    pub heartbeat: Option<HeartbeatAnswer>,
    /// An AlterPartition's refusal of each change, in order (None: done).
    pub refusals: Vec<Option<ControllerError>>,
}

/// The largest encoded operation a controller decodes from a peer.
pub const MAX_OPERATION_BYTES: u64 = 16 << 20;

/// An operation as a peer sends it.
pub fn encode_operation(operation: &Operation) -> Vec<u8> {
    codec::encode(operation)
}

/// A controller's answer as it is sent back.
pub fn encode_answer(answer: &Result<OperationAnswer, ControllerError>) -> Vec<u8> {
    codec::encode(answer)
}

/// A controller's answer as it arrived.
pub fn decode_answer(bytes: &[u8]) -> Result<OperationAnswer, ControllerError> {
    codec::decode_bounded::<Result<OperationAnswer, ControllerError>>(bytes, MAX_OPERATION_BYTES).unwrap_or_else(|e| {
        Err(ControllerError::Unavailable(format!(
            "the controller's answer does not decode: {e}"
        )))
    })
}
