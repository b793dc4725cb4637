//! Scenario tests of the engine, one rule each, in the spirit of Kafka's
//! QuorumStateTest, LeaderStateTest and KafkaRaftClientTest.

use std::collections::BTreeMap;

use super::*;
use crate::messages::*;

const T: u64 = 1000; // election timeout
const FETCH_T: u64 = 2000;

fn config(me: NodeId, voters: &[NodeId]) -> RaftConfig {
    let voters: BTreeMap<NodeId, String> = voters
        .iter()
        .map(|id| (*id, format!("127.0.0.1:{}", 9000 + id)))
        .collect();
    RaftConfig::new(me, voters, format!("127.0.0.1:{}", 9000 + me))
}

fn start(me: NodeId, voters: &[NodeId], election: ElectionState) -> RaftNode {
    RaftNode::new(config(me, voters), election, LogView::empty(), 0, 7)
}

fn log_of(epochs: &[(Epoch, Offset)], end: Offset) -> LogView {
    LogView::new(0, 0, end, epochs.to_vec())
}

/// Whether `actions` write a snapshot chunk or install a snapshot.
fn takes_a_chunk(actions: &[Action]) -> bool {
    actions
        .iter()
        .any(|a| matches!(a, Action::WriteSnapshotChunk { .. } | Action::InstallSnapshot(_)))
}

fn sent(actions: &[Action]) -> Vec<(NodeId, u64, RaftRequest)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send {
                to,
                correlation_id,
                request,
                ..
            } => Some((*to, *correlation_id, request.clone())),
            _ => None,
        })
        .collect()
}

fn persisted(actions: &[Action]) -> Vec<ElectionState> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::PersistElection(s) => Some(s.clone()),
            _ => None,
        })
        .collect()
}

fn responses(actions: &[Action]) -> Vec<RaftResponse> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Respond { response, .. } => Some(response.clone()),
            Action::RespondFetch { response, .. } => Some(RaftResponse::Fetch(response.clone())),
            _ => None,
        })
        .collect()
}

fn position(actions: &[Action], pred: impl Fn(&Action) -> bool) -> usize {
    actions.iter().position(pred).expect("action present")
}

fn vote_req(epoch: Epoch, candidate: NodeId, last_epoch: Epoch, end: Offset, pre_vote: bool) -> RaftRequest {
    RaftRequest::Vote(VoteRequest {
        epoch,
        candidate_id: candidate,
        last_epoch,
        last_epoch_end_offset: end,
        pre_vote,
    })
}

fn begin_req(epoch: Epoch, leader: NodeId) -> RaftRequest {
    RaftRequest::BeginQuorumEpoch(BeginQuorumEpochRequest {
        epoch,
        leader_id: leader,
        leader_endpoint: format!("127.0.0.1:{}", 9000 + leader),
    })
}

fn end_req(epoch: Epoch, leader: NodeId, preferred_successors: Vec<NodeId>) -> RaftRequest {
    RaftRequest::EndQuorumEpoch(EndQuorumEpochRequest {
        epoch,
        leader_id: leader,
        preferred_successors,
    })
}

fn granted(actions: &[Action]) -> bool {
    match responses(actions).last() {
        Some(RaftResponse::Vote(v)) => v.vote_granted,
        other => panic!("no vote response: {other:?}"),
    }
}

fn fetch_req(replica: NodeId, epoch: Epoch, offset: Offset, last_epoch: Epoch, wait: u64) -> RaftRequest {
    RaftRequest::Fetch(FetchRequest {
        replica_id: replica,
        current_epoch: epoch,
        fetch_offset: offset,
        last_fetched_epoch: last_epoch,
        max_wait_ms: wait,
        max_bytes: 1 << 20,
    })
}

/// Drives node 1 of {1,2,3} to leadership of epoch 1 at time `now`.
fn elect_leader() -> (RaftNode, u64) {
    elect_leader_with(config(1, &[1, 2, 3]))
}

/// [`elect_leader`] with `config` (node 1 of {1,2,3}).
fn elect_leader_with(config: RaftConfig) -> (RaftNode, u64) {
    let mut node = RaftNode::new(config, ElectionState::default(), LogView::empty(), 0, 7);
    node.take_actions();
    let mut now = 2 * T + 1;
    node.tick(now);
    let pre_votes = sent(&node.take_actions());
    assert_eq!(node.role().role, RoleKind::Prospective);
    let (to, corr, _) = pre_votes[0].clone();
    node.handle_response(
        now,
        to,
        corr,
        RaftResponse::Vote(VoteResponse {
            error: ErrorCode::None,
            epoch: 0,
            leader_id: None,
            vote_granted: true,
            pre_vote: true,
        }),
    );
    let votes = sent(&node.take_actions());
    assert_eq!(node.role().role, RoleKind::Candidate);
    now += 1;
    let (to, corr, _) = votes[0].clone();
    node.handle_response(
        now,
        to,
        corr,
        RaftResponse::Vote(VoteResponse {
            error: ErrorCode::None,
            epoch: 1,
            leader_id: None,
            vote_granted: true,
            pre_vote: false,
        }),
    );
    assert_eq!(node.role().role, RoleKind::Leader);
    (node, now)
}

// ---------------------------------------------------------------- start

#[test]
fn single_voter_elects_itself_on_start() {
    let mut node = start(1, &[1], ElectionState::default());
    let actions = node.take_actions();
    assert_eq!(node.role().role, RoleKind::Leader);
    assert_eq!(node.role().epoch, 1);
    let states = persisted(&actions);
    assert_eq!(
        states[0],
        ElectionState {
            epoch: 1,
            voted_for: Some(1),
            leader_id: None
        }
    );
    assert_eq!(
        states[1],
        ElectionState {
            epoch: 1,
            voted_for: Some(1),
            leader_id: Some(1)
        }
    );
    let append = position(&actions, |a| matches!(a, Action::AppendBatch(_)));
    let Action::AppendBatch(batch) = &actions[append] else {
        unreachable!()
    };
    assert_eq!(
        batch.records().unwrap(),
        vec![Record::LeaderChange {
            leader_id: 1,
            voters: vec![1],
            granting_voters: vec![1]
        }]
    );
    assert!(actions[append..].contains(&Action::Flush));
    assert_eq!(
        node.high_watermark(),
        0,
        "nothing commits before the leader's own flush"
    );
    node.on_flushed(1, 1);
    assert_eq!(node.high_watermark(), 1);
    assert!(node.take_actions().contains(&Action::HighWatermark(1)));
}

#[test]
fn restart_states_follow_the_persisted_election_state() {
    let leader = start(
        1,
        &[1, 2, 3],
        ElectionState {
            epoch: 4,
            voted_for: Some(1),
            leader_id: Some(1),
        },
    );
    assert_eq!(
        leader.role().role,
        RoleKind::Resigned,
        "a former leader starts Resigned"
    );
    let candidate = start(
        1,
        &[1, 2, 3],
        ElectionState {
            epoch: 4,
            voted_for: Some(1),
            leader_id: None,
        },
    );
    assert_eq!(candidate.role().role, RoleKind::Candidate);
    assert_eq!(candidate.role().epoch, 4, "a restarted candidate keeps its epoch");
    let follower = start(
        1,
        &[1, 2, 3],
        ElectionState {
            epoch: 4,
            voted_for: Some(2),
            leader_id: Some(3),
        },
    );
    assert_eq!(
        (follower.role().role, follower.role().leader_id),
        (RoleKind::Follower, Some(3))
    );
    let voted = start(
        1,
        &[1, 2, 3],
        ElectionState {
            epoch: 4,
            voted_for: Some(2),
            leader_id: None,
        },
    );
    assert_eq!(
        (voted.role().role, voted.role().voted_for),
        (RoleKind::Unattached, Some(2))
    );
    let observer = start(
        9,
        &[1, 2, 3],
        ElectionState {
            epoch: 4,
            voted_for: None,
            leader_id: Some(2),
        },
    );
    assert_eq!(observer.role().role, RoleKind::Follower);
    assert!(!observer.role().is_voter);
}

#[test]
fn a_restarted_candidate_asks_again_in_the_same_epoch() {
    let mut node = start(
        1,
        &[1, 2, 3],
        ElectionState {
            epoch: 4,
            voted_for: Some(1),
            leader_id: None,
        },
    );
    let actions = node.take_actions();
    assert!(persisted(&actions).is_empty());
    let votes = sent(&actions);
    assert_eq!(votes.len(), 2);
    assert!(votes
        .iter()
        .all(|(_, _, r)| matches!(r, RaftRequest::Vote(v) if v.epoch == 4 && !v.pre_vote)));
}

// ---------------------------------------------------------------- elections

#[test]
fn unattached_times_out_into_prospective_without_bumping_the_epoch() {
    let mut node = start(1, &[1, 2, 3], ElectionState::default());
    node.take_actions();
    node.tick(T - 1);
    assert_eq!(
        node.role().role,
        RoleKind::Unattached,
        "the election timeout is at least T"
    );
    node.tick(2 * T);
    let actions = node.take_actions();
    assert_eq!(node.role().role, RoleKind::Prospective);
    assert_eq!(node.role().epoch, 0);
    assert!(persisted(&actions).is_empty(), "Prospective is never persisted");
    let requests = sent(&actions);
    assert_eq!(requests.len(), 2);
    for (_, _, r) in requests {
        assert_eq!(
            r,
            vote_req(1, 1, 0, 0, true),
            "a pre-vote names the epoch it would campaign in"
        );
    }
}

#[test]
fn prospective_becomes_candidate_on_a_majority_and_persists_before_asking() {
    let mut node = start(1, &[1, 2, 3], ElectionState::default());
    node.tick(2 * T);
    let pre_votes = sent(&node.take_actions());
    let (to, corr, _) = pre_votes[0].clone();
    node.handle_response(
        2 * T,
        to,
        corr,
        RaftResponse::Vote(VoteResponse {
            error: ErrorCode::None,
            epoch: 0,
            leader_id: None,
            vote_granted: true,
            pre_vote: true,
        }),
    );
    let actions = node.take_actions();
    assert_eq!(node.role().role, RoleKind::Candidate);
    let persist = position(
        &actions,
        |a| matches!(a, Action::PersistElection(s) if s.epoch == 1 && s.voted_for == Some(1)),
    );
    let first_send = position(&actions, |a| matches!(a, Action::Send { .. }));
    assert!(
        persist < first_send,
        "the candidate's own vote is durable before it asks for others"
    );
}

#[test]
fn a_prospective_that_left_a_leader_ignores_peers_still_naming_it() {
    // Node 2 followed node 1 in epoch 5; its fetches stopped.
    let mut node = start(
        2,
        &[1, 2, 3],
        ElectionState {
            epoch: 5,
            voted_for: None,
            leader_id: Some(1),
        },
    );
    node.take_actions();
    node.tick(FETCH_T);
    assert_eq!(node.role().role, RoleKind::Prospective);
    let pre_votes: Vec<_> = sent(&node.take_actions())
        .into_iter()
        .filter(|(to, _, _)| *to == 3)
        .collect();
    let (to, corr, _) = pre_votes[0].clone();
    // Node 3 has not noticed yet that node 1 is gone, but its fetch timed
    // out too, so it grants — naming node 1 as the leader it knows.
    node.handle_response(
        FETCH_T + 1,
        to,
        corr,
        RaftResponse::Vote(VoteResponse {
            error: ErrorCode::None,
            epoch: 5,
            leader_id: Some(1),
            vote_granted: true,
            pre_vote: true,
        }),
    );
    assert_eq!(
        (node.role().role, node.role().epoch),
        (RoleKind::Candidate, 6),
        "the grant counts; the stale leader is not followed"
    );
}

#[test]
fn a_prospective_refused_by_a_majority_goes_back_to_its_leader() {
    let mut node = start(
        2,
        &[1, 2, 3],
        ElectionState {
            epoch: 5,
            voted_for: None,
            leader_id: Some(1),
        },
    );
    node.take_actions();
    node.tick(FETCH_T);
    let pre_votes = sent(&node.take_actions());
    for (to, corr, _) in pre_votes
        .into_iter()
        .filter(|(_, _, r)| matches!(r, RaftRequest::Vote(_)))
    {
        node.handle_response(
            FETCH_T + 1,
            to,
            corr,
            RaftResponse::Vote(VoteResponse {
                error: ErrorCode::None,
                epoch: 5,
                leader_id: Some(1),
                vote_granted: false,
                pre_vote: true,
            }),
        );
    }
    assert_eq!(
        (node.role().role, node.role().leader_id, node.role().epoch),
        (RoleKind::Follower, Some(1), 5)
    );
    assert!(
        sent(&node.take_actions())
            .iter()
            .any(|(to, _, r)| *to == 1 && matches!(r, RaftRequest::Fetch(_))),
        "fetches again"
    );
}

#[test]
fn prospective_returns_to_unattached_when_the_election_times_out() {
    let mut node = start(1, &[1, 2, 3], ElectionState::default());
    node.tick(2 * T);
    assert_eq!(node.role().role, RoleKind::Prospective);
    node.tick(4 * T + 1);
    assert_eq!(node.role().role, RoleKind::Unattached);
    assert_eq!(node.role().epoch, 0);
}

#[test]
fn candidate_becomes_leader_and_writes_leader_change_first() {
    let (mut node, _) = elect_leader();
    let actions = node.take_actions();
    let persist = position(
        &actions,
        |a| matches!(a, Action::PersistElection(s) if s.leader_id == Some(1)),
    );
    let append = position(&actions, |a| matches!(a, Action::AppendBatch(_)));
    assert!(persist < append);
    let Action::AppendBatch(batch) = &actions[append] else {
        unreachable!()
    };
    assert_eq!((batch.base_offset, batch.epoch), (0, 1));
    match &batch.records().unwrap()[0] {
        Record::LeaderChange {
            leader_id,
            voters,
            granting_voters,
        } => {
            assert_eq!(*leader_id, 1);
            assert_eq!(voters, &vec![1, 2, 3]);
            assert_eq!(granting_voters.len(), 2);
        }
        other => panic!("first record of the epoch is {other:?}"),
    }
    let begin: Vec<_> = sent(&actions)
        .into_iter()
        .filter(|(_, _, r)| matches!(r, RaftRequest::BeginQuorumEpoch(_)))
        .collect();
    assert_eq!(begin.len(), 2, "BeginQuorumEpoch goes to both other voters");
}

#[test]
fn a_candidate_that_lost_backs_off_then_campaigns_again_through_a_pre_vote() {
    let mut node = start(
        1,
        &[1, 2, 3],
        ElectionState {
            epoch: 4,
            voted_for: Some(1),
            leader_id: None,
        },
    );
    node.take_actions();
    node.tick(2 * T + 1);
    assert_eq!(
        (node.role().role, node.role().epoch),
        (RoleKind::Candidate, 4),
        "backing off, same epoch"
    );
    node.tick(2 * T + 1 + 1000 + 1);
    let actions = node.take_actions();
    // No new epoch until a majority says our log could win: a candidate
    // whose log is behind must not keep resetting everybody's timers.
    assert_eq!((node.role().role, node.role().epoch), (RoleKind::Prospective, 4));
    assert!(persisted(&actions).is_empty());
    let pre_votes = sent(&actions);
    assert!(pre_votes
        .iter()
        .all(|(_, _, r)| matches!(r, RaftRequest::Vote(v) if v.pre_vote && v.epoch == 5)));
    let (to, corr, _) = pre_votes[0].clone();
    node.handle_response(
        3001,
        to,
        corr,
        RaftResponse::Vote(VoteResponse {
            error: ErrorCode::None,
            epoch: 4,
            leader_id: None,
            vote_granted: true,
            pre_vote: true,
        }),
    );
    assert_eq!((node.role().role, node.role().epoch), (RoleKind::Candidate, 5));
}

#[test]
fn candidate_rejected_by_a_majority_backs_off_at_once() {
    let mut node = start(
        1,
        &[1, 2, 3],
        ElectionState {
            epoch: 4,
            voted_for: Some(1),
            leader_id: None,
        },
    );
    let votes = sent(&node.take_actions());
    for (to, corr, _) in votes {
        node.handle_response(
            10,
            to,
            corr,
            RaftResponse::Vote(VoteResponse {
                error: ErrorCode::None,
                epoch: 4,
                leader_id: None,
                vote_granted: false,
                pre_vote: false,
            }),
        );
    }
    node.take_actions();
    // Backoff is at most election_backoff_max_ms, far less than 2T.
    node.tick(10 + 1001);
    assert_eq!(node.role().role, RoleKind::Prospective);
}

#[test]
fn election_backoff_is_capped() {
    let mut node = start(1, &[1, 2, 3], ElectionState::default());
    for retries in 1..40 {
        let b = node.election_backoff_ms(retries);
        assert!((100..=1000).contains(&b), "backoff {b} after {retries} retries");
    }
}

// ---------------------------------------------------------------- voting

#[test]
fn a_vote_is_persisted_before_it_is_answered() {
    let mut node = start(1, &[1, 2, 3], ElectionState::default());
    node.take_actions();
    node.handle_request(5, 2, 77, vote_req(1, 2, 0, 0, false));
    let actions = node.take_actions();
    let persist = position(
        &actions,
        |a| matches!(a, Action::PersistElection(s) if s.voted_for == Some(2) && s.epoch == 1),
    );
    let reply = position(&actions, |a| matches!(a, Action::Respond { request_id: 77, .. }));
    assert!(persist < reply);
    assert!(granted(&actions));
}

#[test]
fn one_vote_per_epoch() {
    let mut node = start(1, &[1, 2, 3], ElectionState::default());
    node.handle_request(5, 2, 1, vote_req(1, 2, 0, 0, false));
    assert!(granted(&node.take_actions()));
    node.handle_request(6, 3, 2, vote_req(1, 3, 0, 0, false));
    assert!(!granted(&node.take_actions()), "never a second candidate in one epoch");
    node.handle_request(7, 2, 3, vote_req(1, 2, 0, 0, false));
    assert!(granted(&node.take_actions()), "the same candidate again is fine");
    node.handle_request(8, 3, 4, vote_req(2, 3, 0, 0, false));
    let actions = node.take_actions();
    assert!(granted(&actions), "a higher epoch is a new election");
    assert_eq!(
        node.election_state(),
        &ElectionState {
            epoch: 2,
            voted_for: Some(3),
            leader_id: None
        }
    );
}

#[test]
fn votes_compare_logs_lexicographically() {
    // Our log: epoch 1 at [0,2), epoch 3 at [2,5).
    let log = log_of(&[(1, 0), (3, 2)], 5);
    let mut node = RaftNode::new(
        config(1, &[1, 2, 3]),
        ElectionState {
            epoch: 3,
            voted_for: None,
            leader_id: None,
        },
        log,
        0,
        1,
    );
    node.handle_request(1, 2, 1, vote_req(4, 2, 2, 100, false));
    assert!(
        !granted(&node.take_actions()),
        "an older last epoch loses however long its log"
    );
    node.handle_request(1, 2, 2, vote_req(5, 2, 3, 4, false));
    assert!(!granted(&node.take_actions()), "same last epoch, shorter log");
    node.handle_request(1, 3, 3, vote_req(6, 3, 4, 1, false));
    assert!(
        granted(&node.take_actions()),
        "a newer last epoch wins however short its log"
    );
}

#[test]
fn a_stale_epoch_vote_is_refused_without_state_change() {
    let mut node = start(
        1,
        &[1, 2, 3],
        ElectionState {
            epoch: 5,
            voted_for: None,
            leader_id: None,
        },
    );
    node.take_actions();
    node.handle_request(1, 2, 1, vote_req(4, 2, 0, 0, false));
    let actions = node.take_actions();
    assert!(!granted(&actions));
    assert!(persisted(&actions).is_empty());
    assert_eq!(node.role().epoch, 5);
}

#[test]
fn a_follower_refuses_votes_in_its_leaders_epoch() {
    let mut node = start(
        1,
        &[1, 2, 3],
        ElectionState {
            epoch: 5,
            voted_for: None,
            leader_id: Some(2),
        },
    );
    node.handle_request(1, 3, 1, vote_req(5, 3, 9, 9, false));
    assert!(!granted(&node.take_actions()));
}

#[test]
fn pre_vote_changes_nothing_and_respects_a_live_leader() {
    let mut node = start(
        1,
        &[1, 2, 3],
        ElectionState {
            epoch: 5,
            voted_for: None,
            leader_id: Some(2),
        },
    );
    let fetch = sent(&node.take_actions());
    let (to, corr, _) = fetch[0].clone();
    // A successful fetch from the leader: it is live.
    node.handle_response(
        10,
        to,
        corr,
        RaftResponse::Fetch(FetchResponse {
            error: ErrorCode::None,
            epoch: 5,
            leader_id: Some(2),
            high_watermark: 0,
            log_start_offset: 0,
            diverging_epoch: None,
            snapshot_id: None,
            batches: vec![],
        }),
    );
    node.take_actions();
    node.handle_request(20, 3, 1, vote_req(6, 3, 9, 9, true));
    let actions = node.take_actions();
    assert!(!granted(&actions), "a follower with a live leader refuses pre-votes");
    assert!(persisted(&actions).is_empty());
    assert_eq!(node.role().epoch, 5, "a pre-vote never bumps the epoch");
    // The fetch timeout after its last successful fetch the leader is
    // presumed gone, even before the follower's own timer has run.
    node.handle_request(10 + FETCH_T, 3, 2, vote_req(6, 3, 9, 9, true));
    assert!(
        granted(&node.take_actions()),
        "no successful fetch for the fetch timeout"
    );
    // After the fetch timeout the leader is presumed gone.
    let mut unattached = start(
        1,
        &[1, 2, 3],
        ElectionState {
            epoch: 5,
            voted_for: Some(2),
            leader_id: None,
        },
    );
    unattached.take_actions();
    unattached.handle_request(20, 3, 1, vote_req(6, 3, 9, 9, true));
    let actions = unattached.take_actions();
    assert!(granted(&actions), "pre-votes ignore our earlier vote");
    assert!(persisted(&actions).is_empty());
    assert_eq!(unattached.election_state().voted_for, Some(2));
}

/// KIP-996: a pre-vote is granted only to a candidate whose log is at
/// least as up to date as ours, like a vote. Otherwise a node that cannot
/// win the election would still bump everyone's epoch.
#[test]
fn a_pre_vote_is_refused_to_a_candidate_whose_log_is_behind() {
    // Our log: epoch 1 at [0,2), epoch 3 at [2,5). No leader: only the
    // log decides.
    let election = ElectionState {
        epoch: 3,
        voted_for: None,
        leader_id: None,
    };
    let mut node = RaftNode::new(
        config(1, &[1, 2, 3]),
        election.clone(),
        log_of(&[(1, 0), (3, 2)], 5),
        0,
        1,
    );
    node.take_actions();
    let cases = [
        (2, 100, false, "an older last epoch"),
        (3, 4, false, "the same last epoch, a shorter log"),
        (3, 5, true, "the same log"),
        (4, 1, true, "a newer last epoch"),
    ];
    for (request_id, (last_epoch, end, grant, what)) in (1..).zip(cases) {
        node.handle_request(1, 2, request_id, vote_req(4, 2, last_epoch, end, true));
        let actions = node.take_actions();
        assert_eq!(granted(&actions), grant, "{what}");
        assert!(persisted(&actions).is_empty(), "{what}: a pre-vote persists nothing");
    }
    assert_eq!(node.election_state(), &election);
}

#[test]
fn a_non_voter_candidate_is_refused() {
    let mut node = start(1, &[1, 2, 3], ElectionState::default());
    node.handle_request(1, 9, 1, vote_req(1, 9, 0, 0, false));
    match responses(&node.take_actions()).last() {
        Some(RaftResponse::Vote(v)) => {
            assert!(!v.vote_granted);
            assert_eq!(v.error, ErrorCode::InconsistentVoterSet);
        }
        other => panic!("{other:?}"),
    }
}

/// BeginQuorumEpoch and EndQuorumEpoch come from the leader they name,
/// and that leader is a voter (Kafka's `validateVoterOnlyRequest`); any
/// other is refused and moves nothing, not even the epoch.
#[test]
fn quorum_epoch_requests_must_come_from_the_voter_they_name() {
    let election = ElectionState {
        epoch: 1,
        voted_for: None,
        leader_id: Some(2),
    };
    let refused = |from: NodeId, request: RaftRequest, error: ErrorCode, what: &str| {
        let mut node = start(1, &[1, 2, 3], election.clone());
        node.take_actions();
        node.handle_request(1, from, 1, request);
        let actions = node.take_actions();
        match responses(&actions).last() {
            Some(RaftResponse::BeginQuorumEpoch(r) | RaftResponse::EndQuorumEpoch(r)) => {
                assert_eq!((r.error, r.epoch), (error, 1), "{what}")
            }
            other => panic!("{what}: {other:?}"),
        }
        assert!(persisted(&actions).is_empty(), "{what}: nothing is persisted");
        assert_eq!(node.election_state(), &election, "{what}");
    };
    use ErrorCode::{InconsistentVoterSet as NotVoter, InvalidRequest as Invalid};
    refused(9, end_req(5, 9, vec![1]), NotVoter, "End from a non-voter");
    refused(2, end_req(5, 3, vec![1]), Invalid, "End for another voter");
    refused(1, end_req(5, 1, vec![1]), Invalid, "End naming us");
    refused(2, begin_req(5, 3), Invalid, "Begin for another voter");
    // From the voter it names, the same request is taken.
    let mut node = start(1, &[1, 2, 3], election.clone());
    node.handle_request(1, 3, 1, end_req(5, 3, vec![1]));
    node.take_actions();
    assert_eq!(node.election_state().epoch, 5);
}

#[test]
fn a_higher_epoch_in_any_response_moves_us_into_it() {
    let (mut node, now) = elect_leader();
    let actions = node.take_actions();
    let (to, corr, _) = sent(&actions)
        .into_iter()
        .find(|(_, _, r)| matches!(r, RaftRequest::BeginQuorumEpoch(_)))
        .unwrap();
    node.handle_response(
        now,
        to,
        corr,
        RaftResponse::BeginQuorumEpoch(QuorumEpochResponse {
            error: ErrorCode::FencedLeaderEpoch,
            epoch: 7,
            leader_id: Some(3),
        }),
    );
    assert_eq!(
        (node.role().role, node.role().epoch, node.role().leader_id),
        (RoleKind::Follower, 7, Some(3))
    );
    assert_eq!(persisted(&node.take_actions()).last().unwrap().epoch, 7);
}

// ---------------------------------------------------------------- BeginQuorumEpoch / EndQuorumEpoch

#[test]
fn begin_quorum_epoch_makes_a_follower() {
    let mut node = start(
        1,
        &[1, 2, 3],
        ElectionState {
            epoch: 2,
            voted_for: Some(3),
            leader_id: None,
        },
    );
    node.handle_request(1, 3, 1, begin_req(2, 3));
    let actions = node.take_actions();
    assert_eq!((node.role().role, node.role().leader_id), (RoleKind::Follower, Some(3)));
    assert_eq!(
        persisted(&actions),
        vec![ElectionState {
            epoch: 2,
            voted_for: Some(3),
            leader_id: Some(3)
        }],
        "the vote is kept"
    );
    node.handle_request(2, 2, 2, begin_req(1, 2));
    match responses(&node.take_actions()).last() {
        Some(RaftResponse::BeginQuorumEpoch(r)) => assert_eq!((r.error, r.epoch), (ErrorCode::FencedLeaderEpoch, 2)),
        other => panic!("{other:?}"),
    }
}

#[test]
fn leader_resends_begin_quorum_epoch_to_voters_that_stopped_fetching() {
    let (mut node, now) = elect_leader();
    node.take_actions();
    let begin_quorum_targets = |node: &mut RaftNode| -> Vec<(NodeId, u64)> {
        sent(&node.take_actions())
            .into_iter()
            .filter(|(_, _, r)| matches!(r, RaftRequest::BeginQuorumEpoch(_)))
            .map(|(to, corr, _)| (to, corr))
            .collect()
    };
    // Past the resend interval, voter 2 fetches: only voter 3 is asked again.
    node.handle_request(now + FETCH_T, 2, 1, fetch_req(2, 1, 0, 0, 0));
    let resent = begin_quorum_targets(&mut node);
    assert_eq!(resent.iter().map(|(to, _)| *to).collect::<Vec<_>>(), vec![3]);

    // Voter 2 has been silent for half the fetch timeout: it may have moved
    // on to a later epoch (a candidacy the leader never heard of).
    node.tick(now + FETCH_T + FETCH_T / 2 + 1);
    let resent = begin_quorum_targets(&mut node);
    let (to, corr) = *resent.iter().find(|(to, _)| *to == 2).expect("voter 2 is asked again");
    node.handle_response(
        now + FETCH_T + FETCH_T / 2 + 2,
        to,
        corr,
        RaftResponse::BeginQuorumEpoch(QuorumEpochResponse {
            error: ErrorCode::FencedLeaderEpoch,
            epoch: 5,
            leader_id: None,
        }),
    );
    assert_eq!(
        (node.role().role, node.role().epoch),
        (RoleKind::Unattached, 5),
        "the stale leader steps down into the later epoch"
    );
}

#[test]
fn graceful_resignation_names_successors_by_replicated_offset() {
    let (mut node, now) = elect_leader();
    node.take_actions();
    node.on_flushed(now, 1);
    node.handle_request(now, 3, 1, fetch_req(3, 1, 1, 1, 0));
    node.take_actions();
    node.resign(now + 1);
    let actions = node.take_actions();
    assert_eq!(node.role().role, RoleKind::Resigned);
    let ends: Vec<_> = sent(&actions)
        .into_iter()
        .filter_map(|(to, _, r)| match r {
            RaftRequest::EndQuorumEpoch(e) => Some((to, e.preferred_successors)),
            _ => None,
        })
        .collect();
    assert_eq!(ends.len(), 2);
    assert!(ends.iter().all(|(_, s)| s == &vec![3, 2]), "{ends:?}");
    assert!(matches!(
        node.propose(now + 2, vec![Record::NoOp]),
        Err(ProposeError::NotLeader { .. })
    ));
}

#[test]
fn end_quorum_epoch_makes_the_first_successor_campaign_at_once() {
    let mut node = start(
        3,
        &[1, 2, 3],
        ElectionState {
            epoch: 2,
            voted_for: None,
            leader_id: Some(1),
        },
    );
    node.take_actions();
    node.handle_request(100, 1, 1, end_req(2, 1, vec![3, 2]));
    node.tick(100);
    assert_eq!(node.role().role, RoleKind::Prospective, "rank 0 waits no time");
    let mut second = start(
        2,
        &[1, 2, 3],
        ElectionState {
            epoch: 2,
            voted_for: None,
            leader_id: Some(1),
        },
    );
    second.handle_request(100, 1, 1, end_req(2, 1, vec![3, 2]));
    second.tick(150);
    assert_eq!(second.role().role, RoleKind::Follower);
    second.tick(201);
    assert_eq!(
        second.role().role,
        RoleKind::Prospective,
        "rank 1 waits the base backoff"
    );
}

// ---------------------------------------------------------------- leader: fetch and HW

#[test]
fn high_watermark_needs_a_majority_past_the_epoch_start() {
    let (mut node, now) = elect_leader();
    node.take_actions();
    let p = node.propose(now, vec![Record::Data(b"a".to_vec())]).unwrap();
    // Linger 0 with a flush in flight: it waits for the next batch.
    assert_eq!((p.base_offset, p.last_offset, p.epoch), (1, 1, 1));
    node.on_flushed(now, 1);
    assert_eq!(node.high_watermark(), 0, "the leader alone is no majority");
    let actions = node.take_actions();
    assert!(
        actions
            .iter()
            .any(|a| matches!(a, Action::AppendBatch(b) if b.base_offset == 1)),
        "{actions:?}"
    );
    node.handle_request(now, 2, 1, fetch_req(2, 1, 1, 1, 0));
    assert_eq!(node.high_watermark(), 1, "leader (flushed to 1) + follower at 1");
    node.handle_request(now, 2, 2, fetch_req(2, 1, 2, 1, 0));
    assert_eq!(node.high_watermark(), 1, "the leader has not flushed offset 1 yet");
    node.on_flushed(now, 2);
    assert_eq!(node.high_watermark(), 2);
}

#[test]
fn leader_does_not_commit_an_old_epoch_until_its_own_record_commits() {
    // Log from epoch 1: [0, 5). Elected in epoch 2 → LeaderChange at 5.
    let log = log_of(&[(1, 0)], 5);
    let mut node = RaftNode::new(
        config(1, &[1, 2, 3]),
        ElectionState {
            epoch: 1,
            voted_for: Some(1),
            leader_id: None,
        },
        log,
        0,
        1,
    );
    node.tick(2 * T + 1);
    let backoff_done = 2 * T + 1 + 1001;
    node.tick(backoff_done);
    let pre_votes: Vec<_> = sent(&node.take_actions())
        .into_iter()
        .filter(|(_, _, r)| matches!(r, RaftRequest::Vote(v) if v.pre_vote))
        .collect();
    let (to, corr, _) = pre_votes[0].clone();
    node.handle_response(
        backoff_done,
        to,
        corr,
        RaftResponse::Vote(VoteResponse {
            error: ErrorCode::None,
            epoch: 1,
            leader_id: None,
            vote_granted: true,
            pre_vote: true,
        }),
    );
    let votes: Vec<_> = sent(&node.take_actions())
        .into_iter()
        .filter(|(_, _, r)| matches!(r, RaftRequest::Vote(v) if v.epoch == 2 && !v.pre_vote))
        .collect();
    let (to, corr, _) = votes[0].clone();
    node.handle_response(
        backoff_done,
        to,
        corr,
        RaftResponse::Vote(VoteResponse {
            error: ErrorCode::None,
            epoch: 2,
            leader_id: None,
            vote_granted: true,
            pre_vote: false,
        }),
    );
    assert_eq!(node.role().role, RoleKind::Leader);
    node.on_flushed(backoff_done, 6);
    node.handle_request(backoff_done, 2, 1, fetch_req(2, 2, 5, 1, 0));
    assert_eq!(
        node.high_watermark(),
        0,
        "offset 5 is the epoch start: nothing commits yet"
    );
    node.handle_request(backoff_done, 2, 2, fetch_req(2, 2, 6, 2, 0));
    assert_eq!(node.high_watermark(), 6);
}

#[test]
fn a_diverging_fetch_is_told_where_to_truncate() {
    // Leader log: epoch 1 [0,3), epoch 3 [3,6); leader of epoch 4.
    let log = log_of(&[(1, 0), (3, 3)], 6);
    let mut node = RaftNode::new(
        config(1, &[1, 2, 3]),
        ElectionState {
            epoch: 4,
            voted_for: Some(1),
            leader_id: None,
        },
        log,
        0,
        1,
    );
    let votes = sent(&node.take_actions());
    let (to, corr, _) = votes[0].clone();
    node.handle_response(
        1,
        to,
        corr,
        RaftResponse::Vote(VoteResponse {
            error: ErrorCode::None,
            epoch: 4,
            leader_id: None,
            vote_granted: true,
            pre_vote: false,
        }),
    );
    assert_eq!(node.role().role, RoleKind::Leader);
    node.take_actions();
    // Follower has epoch 2 entries up to 5, which we never had.
    node.handle_request(2, 2, 1, fetch_req(2, 4, 5, 2, 0));
    match responses(&node.take_actions()).last() {
        Some(RaftResponse::Fetch(f)) => assert_eq!(
            f.diverging_epoch,
            Some(DivergingEpoch {
                epoch: 1,
                end_offset: 3
            })
        ),
        other => panic!("{other:?}"),
    }
    // Same epoch but past where it ends in our log.
    node.handle_request(2, 2, 2, fetch_req(2, 4, 4, 1, 0));
    match responses(&node.take_actions()).last() {
        Some(RaftResponse::Fetch(f)) => assert_eq!(
            f.diverging_epoch,
            Some(DivergingEpoch {
                epoch: 1,
                end_offset: 3
            })
        ),
        other => panic!("{other:?}"),
    }
    // An epoch we never had, at an offset where our older epoch ends: the
    // offsets agree, the batch before them does not.
    node.handle_request(2, 2, 4, fetch_req(2, 4, 3, 2, 0));
    match responses(&node.take_actions()).last() {
        Some(RaftResponse::Fetch(f)) => assert_eq!(
            f.diverging_epoch,
            Some(DivergingEpoch {
                epoch: 1,
                end_offset: 3
            }),
            "the fetcher's epoch 2 before offset 3 is not in our log"
        ),
        other => panic!("{other:?}"),
    }
    // A true prefix reads data.
    node.handle_request(2, 2, 3, fetch_req(2, 4, 3, 1, 0));
    let actions = node.take_actions();
    assert!(
        actions.iter().any(|a| matches!(
            a,
            Action::RespondFetch {
                read: Some(ReadRange { from: 3, until: 7, .. }),
                ..
            }
        )),
        "{actions:?}"
    );
}

/// The errors the leader of epoch 1 answers `fetches` (sender, request)
/// with, in order.
fn fetch_errors(fetches: Vec<(NodeId, RaftRequest)>) -> Vec<ErrorCode> {
    let (mut node, now) = elect_leader();
    node.take_actions();
    for (id, (from, fetch)) in fetches.into_iter().enumerate() {
        node.handle_request(now, from, id as u64 + 1, fetch);
    }
    responses(&node.take_actions())
        .into_iter()
        .map(|r| match r {
            RaftResponse::Fetch(f) => f.error,
            other => panic!("{other:?}"),
        })
        .collect()
}

#[test]
fn fetches_with_a_wrong_epoch_are_refused() {
    assert_eq!(
        fetch_errors(vec![(2, fetch_req(2, 0, 0, 0, 0)), (2, fetch_req(2, 9, 0, 0, 0))]),
        vec![ErrorCode::FencedLeaderEpoch, ErrorCode::UnknownLeaderEpoch]
    );
}

/// A fetch naming the leader itself as its replica, or a negative offset,
/// is refused as invalid.
#[test]
fn a_fetch_from_the_leaders_own_id_or_at_a_negative_offset_is_invalid() {
    assert_eq!(
        fetch_errors(vec![(1, fetch_req(1, 1, 0, 0, 0)), (2, fetch_req(2, 1, -1, 0, 0))]),
        vec![ErrorCode::InvalidRequest; 2]
    );
}

/// Asserts that `actions` answer `count` fetches, each telling the high
/// watermark `hw`.
fn assert_fetches_told(actions: &[Action], count: usize, hw: Offset) {
    let answers = responses(actions);
    assert_eq!(answers.len(), count, "{answers:?}");
    for answer in answers {
        let RaftResponse::Fetch(fetch) = answer else {
            panic!("not a fetch answer: {answer:?}")
        };
        assert_eq!(fetch.high_watermark, hw);
    }
}

/// How long the leader keeps a fetch that is behind on the high watermark.
fn hw_linger() -> u64 {
    let linger = config(1, &[1, 2, 3]).high_watermark_linger_ms;
    assert!(linger > 0 && linger < 500, "shorter than a fetch's max wait");
    linger
}

/// Two followers caught up and parked at offset 2, one record (offset 1)
/// proposed and flushed on the leader, and node 2's fetch at 2 moving the
/// high watermark to 2 at `now + 1`.
fn leader_whose_high_watermark_node_2_just_moved() -> (RaftNode, u64) {
    let (mut node, now) = elect_leader();
    node.take_actions();
    node.on_flushed(now, 1);
    // Both followers are caught up and told the HW of 1.
    node.handle_request(now, 2, 1, fetch_req(2, 1, 1, 1, 500));
    node.handle_request(now, 3, 2, fetch_req(3, 1, 1, 1, 500));
    node.tick(now + hw_linger());
    node.take_actions();
    let now = now + hw_linger();
    node.handle_request(now, 2, 3, fetch_req(2, 1, 1, 1, 500));
    node.handle_request(now, 3, 4, fetch_req(3, 1, 1, 1, 500));
    assert!(responses(&node.take_actions()).is_empty(), "both parked");
    node.propose(now, vec![Record::Data(b"x".to_vec())]).unwrap();
    node.on_flushed(now, 2);
    // Both parked fetches take the record.
    assert_eq!(responses(&node.take_actions()).len(), 2);
    node.handle_request(now + 1, 2, 5, fetch_req(2, 1, 2, 1, 500));
    assert_eq!(node.high_watermark(), 2);
    (node, now + 1)
}

/// A follower whose fetch moved the high watermark, or finds it past what
/// it was last told (the other follower's fetch moved it while this one
/// was flushing), must not wait out its fetch's max wait to learn it: it is
/// answered within the high watermark linger. Kafka's KIP-1166 fixes the
/// same lag.
#[test]
fn a_fetch_behind_on_the_high_watermark_is_answered_within_the_linger() {
    let (mut node, now) = leader_whose_high_watermark_node_2_just_moved();
    let linger = hw_linger();
    assert!(responses(&node.take_actions()).is_empty(), "node 2 lingers");
    // Node 3 was flushing meanwhile; it fetches at 2 after node 2 already
    // moved the HW. Without the rule it parks until now + 500.
    node.handle_request(now + 1, 3, 6, fetch_req(3, 1, 2, 1, 500));
    assert!(responses(&node.take_actions()).is_empty(), "node 3 lingers");
    node.tick(now + linger - 1);
    assert!(responses(&node.take_actions()).is_empty());
    node.tick(now + linger);
    let told: Vec<u64> = node
        .take_actions()
        .iter()
        .filter_map(|a| match a {
            Action::RespondFetch {
                response, request_id, ..
            } if response.high_watermark == 2 => Some(*request_id),
            _ => None,
        })
        .collect();
    assert_eq!(told.len(), 1, "node 2's fetch, the linger after it moved the HW");
    node.tick(now + 1 + linger);
    assert_eq!(fetch_response(&node.take_actions()).high_watermark, 2, "node 3's");
    // Told now: the next caught-up fetch parks for the whole max wait.
    node.handle_request(now + 1 + linger, 3, 7, fetch_req(3, 1, 2, 1, 500));
    node.tick(now + 400);
    assert!(responses(&node.take_actions()).is_empty(), "parked");
}

/// A parked fetch is told that another replica's fetch moved the high
/// watermark within the linger, not at the end of its wait.
#[test]
fn parked_fetches_learn_a_moved_high_watermark_within_the_linger() {
    let (mut node, now) = elect_leader();
    node.take_actions();
    node.on_flushed(now, 1);
    // Node 2 and observer 7 are told the HW of 1.
    node.handle_request(now, 2, 1, fetch_req(2, 1, 1, 1, 500));
    node.handle_request(now, 7, 2, fetch_req(7, 1, 1, 1, 500));
    let linger = hw_linger();
    node.tick(now + linger);
    assert_eq!(responses(&node.take_actions()).len(), 2);
    let now = now + linger;
    node.propose(now, vec![Record::Data(b"x".to_vec())]).unwrap();
    node.on_flushed(now, 2);
    node.handle_request(now, 2, 3, fetch_req(2, 1, 1, 1, 500));
    node.handle_request(now, 7, 4, fetch_req(7, 1, 1, 1, 500));
    assert_eq!(responses(&node.take_actions()).len(), 2, "both take the record");
    // The observer has it on disk first; it does not count: parked.
    node.handle_request(now + 1, 7, 5, fetch_req(7, 1, 2, 1, 500));
    assert!(responses(&node.take_actions()).is_empty());
    assert_eq!(node.high_watermark(), 1);
    // Node 2's fetch makes a majority at 2 with the leader.
    node.handle_request(now + 2, 2, 6, fetch_req(2, 1, 2, 1, 500));
    assert_eq!(node.high_watermark(), 2);
    assert!(responses(&node.take_actions()).is_empty(), "both linger");
    node.tick(now + 2 + linger - 1);
    assert!(responses(&node.take_actions()).is_empty());
    node.tick(now + 2 + linger);
    assert_fetches_told(&node.take_actions(), 2, 2);
}

/// A leader with writes in flight (x, not yet committed) tells a replica
/// behind on the high watermark at once, as Kafka does: more records are
/// coming, and followers keep fetching for them anyway.
#[test]
fn a_leader_with_writes_in_flight_tells_the_high_watermark_at_once() {
    let (mut node, now) = elect_leader();
    node.take_actions();
    // The LeaderChange (offset 0) is being flushed; x waits for that flush.
    node.propose(now, vec![Record::Data(b"x".to_vec())]).unwrap();
    node.handle_request(now, 2, 1, fetch_req(2, 1, 0, 0, 500));
    node.handle_request(now, 2, 2, fetch_req(2, 1, 1, 1, 500));
    assert_eq!(fetch_response(&node.take_actions()).high_watermark, 0, "x, HW 0");
    // The first flush moves the HW to 1 and starts the flush of x.
    node.on_flushed(now + 1, 1);
    assert_eq!(node.high_watermark(), 1);
    node.take_actions();
    // Node 2 has x and was told 0: answered at once with the HW of 1.
    node.handle_request(now + 2, 2, 3, fetch_req(2, 1, 2, 1, 500));
    assert_eq!(fetch_response(&node.take_actions()).high_watermark, 1);
}

/// A leader that steps down within the linger first tells the fetches it
/// held back the high watermark: answered as the new epoch would answer
/// them (an error), their replicas would learn the last commit only from
/// the next leader.
#[test]
fn a_leader_stepping_down_within_the_linger_tells_the_high_watermark_first() {
    let (mut node, now) = leader_whose_high_watermark_node_2_just_moved();
    assert!(responses(&node.take_actions()).is_empty(), "node 2 lingers");
    node.resign(now + 1);
    let actions = node.take_actions();
    assert_eq!(node.role().role, RoleKind::Resigned);
    let answer = fetch_response(&actions);
    assert_eq!(
        (answer.error, answer.high_watermark),
        (ErrorCode::None, 2),
        "{actions:?}"
    );
}

/// With writes in flight (the log ends past the new high watermark), a
/// parked fetch is told at once when another replica's fetch moves it.
#[test]
fn with_writes_in_flight_parked_fetches_learn_a_moved_high_watermark_at_once() {
    let (mut node, now) = elect_leader();
    node.take_actions();
    node.on_flushed(now, 1);
    node.propose(now, vec![Record::Data(b"x".to_vec())]).unwrap();
    node.on_flushed(now, 2);
    node.propose(now, vec![Record::Data(b"y".to_vec())]).unwrap();
    node.on_flushed(now, 3);
    node.take_actions();
    // Observer 7 reads all three records and parks at the end (HW 0).
    node.handle_request(now, 7, 1, fetch_req(7, 1, 0, 0, 500));
    assert_eq!(fetch_response(&node.take_actions()).high_watermark, 0);
    node.handle_request(now, 7, 2, fetch_req(7, 1, 3, 1, 500));
    assert!(responses(&node.take_actions()).is_empty(), "parked");
    // Node 2 has x: with the leader, a majority at 2, and y in flight.
    node.handle_request(now + 1, 2, 3, fetch_req(2, 1, 2, 1, 500));
    assert_eq!(node.high_watermark(), 2);
    // Node 2's answer and the observer's.
    assert_fetches_told(&node.take_actions(), 2, 2);
}

/// Records that come within the linger go out at once, with the high
/// watermark: under a trickle of writes a follower gets one answer per
/// commit, not one for the records and another for the news.
#[test]
fn records_within_the_high_watermark_linger_carry_the_news() {
    let (mut node, now) = leader_whose_high_watermark_node_2_just_moved();
    assert!(responses(&node.take_actions()).is_empty(), "node 2 lingers");
    node.propose(now + 1, vec![Record::Data(b"y".to_vec())]).unwrap();
    let answer = fetch_response(&node.take_actions());
    assert_eq!(answer.high_watermark, 2);
    // With no linger (Kafka), the fetch that moved the HW is answered at once.
    let mut config = config(1, &[1, 2, 3]);
    config.high_watermark_linger_ms = 0;
    let (mut kafka, now) = elect_leader_with(config);
    kafka.take_actions();
    kafka.on_flushed(now, 1);
    kafka.handle_request(now, 2, 1, fetch_req(2, 1, 1, 1, 500));
    let actions = kafka.take_actions();
    assert!(actions.contains(&Action::HighWatermark(1)));
    assert_eq!(fetch_response(&actions).high_watermark, 1);
}

/// The leader reads at most FETCH_READ_MAX_BYTES for one answer, however
/// much the fetcher asks for: each answer is held in memory while it is
/// encoded and sent.
#[test]
fn a_fetch_answer_reads_at_most_fetch_read_max_bytes() {
    let (mut node, now) = elect_leader();
    node.take_actions();
    let asking = |max_bytes: u32| {
        RaftRequest::Fetch(FetchRequest {
            replica_id: 2,
            current_epoch: 1,
            fetch_offset: 0,
            last_fetched_epoch: 0,
            max_wait_ms: 0,
            max_bytes,
        })
    };
    let cases = [
        (1, MAX_BATCH_BYTES as u32, FETCH_READ_MAX_BYTES),
        (2, u32::MAX, FETCH_READ_MAX_BYTES),
        (3, 4096, 4096),
    ];
    for (request_id, asked, read) in cases {
        node.handle_request(now, 2, request_id, asking(asked));
        let actions = node.take_actions();
        assert!(
            actions.iter().any(|a| matches!(
                a,
                Action::RespondFetch {
                    read: Some(ReadRange { from: 0, max_bytes, .. }),
                    ..
                } if *max_bytes == read
            )),
            "asked for {asked} bytes: {actions:?}"
        );
    }
}

#[test]
fn a_caught_up_fetch_parks_until_data_or_timeout() {
    let (mut node, now) = elect_leader();
    node.take_actions();
    node.on_flushed(now, 1);
    node.handle_request(now, 2, 1, fetch_req(2, 1, 1, 1, 500));
    let actions = node.take_actions();
    assert!(actions.contains(&Action::HighWatermark(1)));
    assert!(
        responses(&actions).is_empty(),
        "this fetch moved the HW: parked for the linger, in case records come"
    );
    let linger = hw_linger();
    node.tick(now + linger);
    assert_eq!(fetch_response(&node.take_actions()).high_watermark, 1);
    node.handle_request(now + linger, 2, 1, fetch_req(2, 1, 1, 1, 500));
    let actions = node.take_actions();
    assert!(responses(&actions).is_empty(), "parked: {actions:?}");
    node.propose(now + 10, vec![Record::Data(b"x".to_vec())]).unwrap();
    let actions = node.take_actions();
    assert!(
        actions.iter().any(|a| matches!(
            a,
            Action::RespondFetch {
                request_id: 1,
                read: Some(ReadRange { from: 1, until: 2, .. }),
                ..
            }
        )),
        "woken by the append: {actions:?}"
    );
    // Node 3 was never told the high watermark: its fetch commits x (with
    // the leader's flush), so the leader holds nothing uncommitted and
    // answers it when the linger is over; then it parks like node 2.
    node.on_flushed(now + 15, 2);
    node.take_actions();
    node.handle_request(now + 20, 3, 2, fetch_req(3, 1, 2, 1, 500));
    assert!(responses(&node.take_actions()).is_empty());
    node.tick(now + 20 + linger);
    assert_eq!(responses(&node.take_actions()).len(), 1);
    node.handle_request(now + 20 + linger, 3, 2, fetch_req(3, 1, 2, 1, 500));
    assert!(responses(&node.take_actions()).is_empty());
    node.tick(now + 420);
    assert!(responses(&node.take_actions()).is_empty());
    // The idle leader's NoOp (500 ms after the last append) wakes it.
    node.tick(now + 510);
    let actions = node.take_actions();
    assert!(
        actions.iter().any(|a| matches!(
            a,
            Action::RespondFetch {
                request_id: 2,
                read: Some(ReadRange { from: 2, until: 3, .. }),
                ..
            }
        )),
        "{actions:?}"
    );
    node.handle_request(now + 600, 3, 3, fetch_req(3, 1, 3, 1, 100));
    node.tick(now + 699);
    assert!(responses(&node.take_actions()).is_empty());
    node.tick(now + 700);
    let actions = node.take_actions();
    assert!(
        actions.iter().any(|a| matches!(
            a,
            Action::RespondFetch {
                request_id: 3,
                read: None,
                ..
            }
        )),
        "answered empty at max_wait: {actions:?}"
    );
}

#[test]
fn check_quorum_failure_resigns_the_leader() {
    let (mut node, now) = elect_leader();
    node.take_actions();
    node.tick(now + FETCH_T * 3 / 2 - 1);
    assert_eq!(node.role().role, RoleKind::Leader);
    node.tick(now + FETCH_T * 3 / 2);
    assert_eq!(node.role().role, RoleKind::Resigned);
    let ends = sent(&node.take_actions())
        .into_iter()
        .filter(|(_, _, r)| matches!(r, RaftRequest::EndQuorumEpoch(_)))
        .count();
    assert_eq!(ends, 2);
}

#[test]
fn check_quorum_holds_while_a_majority_fetches() {
    let (mut node, mut now) = elect_leader();
    for _ in 0..10 {
        now += FETCH_T;
        node.handle_request(now, 2, now, fetch_req(2, 1, 0, 0, 0));
        node.tick(now);
        assert_eq!(node.role().role, RoleKind::Leader);
    }
}

#[test]
fn idle_leader_appends_noop_records() {
    let (mut node, now) = elect_leader();
    node.take_actions();
    node.on_flushed(now, 1);
    node.tick(now + 499);
    assert!(!node.take_actions().iter().any(|a| matches!(a, Action::AppendBatch(_))));
    node.tick(now + 500);
    let actions = node.take_actions();
    let noop = actions.iter().find_map(|a| match a {
        Action::AppendBatch(b) => Some(b.records().unwrap()),
        _ => None,
    });
    assert_eq!(noop, Some(vec![Record::NoOp]));
}

#[test]
fn observers_are_tracked_but_never_count_toward_the_high_watermark() {
    let (mut node, now) = elect_leader();
    node.on_flushed(now, 1);
    node.handle_request(now, 9, 1, fetch_req(9, 1, 1, 1, 0));
    assert_eq!(node.high_watermark(), 0);
    let d = node.describe(now);
    assert_eq!(d.observers.len(), 1);
    assert_eq!(d.voters.len(), 3);
}

/// A replica is caught up when it fetches from the leader's log end, not
/// before; describe tells how long ago that last was.
#[test]
fn a_replica_is_caught_up_only_when_it_fetches_from_the_log_end() {
    let (mut node, now) = elect_leader();
    node.on_flushed(now, 1);
    node.handle_request(now, 2, 1, fetch_req(2, 1, 0, 0, 0));
    node.handle_request(now, 3, 2, fetch_req(3, 1, 1, 1, 0));
    let d = node.describe(now + 10);
    let caught_up_ago = |id: NodeId| {
        d.voters
            .iter()
            .find(|r| r.id == id)
            .expect("a voter")
            .last_caught_up_ms_ago
    };
    assert_eq!(caught_up_ago(2), None, "behind the log end");
    assert_eq!(caught_up_ago(3), Some(10));
}

// ---------------------------------------------------------------- accumulator

#[test]
fn appends_during_a_flush_go_into_one_next_batch() {
    let (mut node, now) = elect_leader();
    node.take_actions(); // LeaderChange appended, flush in flight
    for i in 0..5u8 {
        node.propose(now, vec![Record::Data(vec![i])]).unwrap();
    }
    assert!(
        !node.take_actions().iter().any(|a| matches!(a, Action::AppendBatch(_))),
        "waits for the flush"
    );
    node.on_flushed(now, 1);
    let batches = appended_batches(node.take_actions());
    assert_eq!(batches.len(), 1);
    assert_eq!((batches[0].base_offset, batches[0].record_count), (1, 5));
}

#[test]
fn a_lone_append_on_an_idle_leader_is_written_at_once() {
    let (mut node, now) = elect_leader();
    node.on_flushed(now, 1);
    node.take_actions();
    node.propose(now, vec![Record::Data(b"a".to_vec())]).unwrap();
    let actions = node.take_actions();
    assert!(actions.iter().any(|a| matches!(a, Action::AppendBatch(_))));
    assert!(actions.contains(&Action::Flush));
}

fn appended_batches(actions: Vec<Action>) -> Vec<Batch> {
    actions
        .into_iter()
        .filter_map(|a| match a {
            Action::AppendBatch(b) => Some(b),
            _ => None,
        })
        .collect()
}

#[test]
fn proposals_made_together_go_into_one_batch_on_an_idle_leader() {
    let (mut node, now) = elect_leader();
    node.on_flushed(now, 1);
    node.take_actions();
    let outcomes = node.propose_many(
        now,
        (0..3u8).map(|i| vec![Record::Data(vec![i]), Record::Data(vec![i])]),
    );
    let offsets: Vec<(Offset, Offset)> = outcomes
        .into_iter()
        .map(|o| o.map(|p| (p.base_offset, p.last_offset)).unwrap())
        .collect();
    assert_eq!(offsets, vec![(1, 2), (3, 4), (5, 6)]);
    let batches = appended_batches(node.take_actions());
    assert_eq!(batches.len(), 1, "one batch, not the first proposal alone: {batches:?}");
    assert_eq!((batches[0].base_offset, batches[0].record_count), (1, 6));
}

/// A leader of epoch 1 whose record at offset 1 is being flushed, with
/// record "b" (offset 2) waiting in the accumulator for that flush.
fn leader_with_a_record_waiting_for_its_flush() -> (RaftNode, u64) {
    let (mut node, now) = elect_leader();
    node.on_flushed(now, 1);
    node.take_actions();
    node.propose(now, vec![Record::Data(b"a".to_vec())]).unwrap();
    assert_eq!(
        appended_batches(node.take_actions()).len(),
        1,
        "an idle leader writes at once"
    );
    node.propose(now, vec![Record::Data(b"b".to_vec())]).unwrap();
    assert!(appended_batches(node.take_actions()).is_empty(), "waits for the flush");
    (node, now)
}

/// The log ranges that fetch answers among `actions` carry, as (from, until).
fn fetch_reads(actions: &[Action]) -> Vec<(Offset, Offset)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::RespondFetch { read, .. } => read.as_ref().map(|r| (r.from, r.until)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_fetch_at_the_log_end_takes_the_records_waiting_for_the_leaders_flush() {
    let (mut node, now) = leader_with_a_record_waiting_for_its_flush();
    node.handle_request(now, 2, 1, fetch_req(2, 1, 2, 1, 500));
    let actions = node.take_actions();
    assert_eq!(fetch_reads(&actions), vec![(2, 3)], "answered with \"b\", not parked");
    assert!(
        !actions.contains(&Action::Flush),
        "the leader's flush is still in flight"
    );
}

#[test]
fn a_parked_fetch_takes_a_new_proposal_while_the_leaders_flush_runs() {
    let (mut node, now) = elect_leader();
    node.on_flushed(now, 1);
    node.take_actions();
    node.propose(now, vec![Record::Data(b"a".to_vec())]).unwrap();
    node.handle_request(now, 2, 1, fetch_req(2, 1, 1, 1, 500));
    assert_eq!(fetch_reads(&node.take_actions()), vec![(1, 2)]);
    node.handle_request(now, 2, 2, fetch_req(2, 1, 2, 1, 500));
    assert!(responses(&node.take_actions()).is_empty(), "parked at the log end");
    node.propose(now, vec![Record::Data(b"b".to_vec())]).unwrap();
    assert_eq!(fetch_reads(&node.take_actions()), vec![(2, 3)]);
}

#[test]
fn linger_holds_appends_until_it_expires() {
    let mut cfg = config(1, &[1]);
    cfg.append_linger_ms = 25;
    let mut node = RaftNode::new(cfg, ElectionState::default(), LogView::empty(), 0, 1);
    node.on_flushed(0, 1);
    node.take_actions();
    node.propose(10, vec![Record::Data(b"a".to_vec())]).unwrap();
    assert!(!node.take_actions().iter().any(|a| matches!(a, Action::AppendBatch(_))));
    assert_eq!(
        node.next_deadline_ms(),
        35,
        "its shell wakes it when the linger runs out"
    );
    node.tick(34);
    assert!(!node.take_actions().iter().any(|a| matches!(a, Action::AppendBatch(_))));
    node.tick(35);
    assert!(node.take_actions().iter().any(|a| matches!(a, Action::AppendBatch(_))));
}

#[test]
fn batches_are_capped_by_max_batch_bytes() {
    let mut cfg = config(1, &[1]);
    cfg.max_batch_bytes = 100;
    let mut node = RaftNode::new(cfg, ElectionState::default(), LogView::empty(), 0, 1);
    node.take_actions(); // flush of the LeaderChange in flight
    assert!(matches!(
        node.propose(1, vec![Record::Data(vec![0; 200])]),
        Err(ProposeError::TooLarge { .. })
    ));
    node.propose(1, vec![Record::Data(vec![0; 60])]).unwrap();
    let p = node.propose(1, vec![Record::Data(vec![0; 60])]).unwrap();
    assert_eq!(p.base_offset, 2);
    let appended = node
        .take_actions()
        .iter()
        .filter(|a| matches!(a, Action::AppendBatch(_)))
        .count();
    assert_eq!(appended, 1, "the first batch was full and written without waiting");
    assert!(matches!(node.propose(1, vec![]), Err(ProposeError::Empty)));
}

// ---------------------------------------------------------------- follower

fn follower_with_fetch() -> (RaftNode, u64) {
    let mut node = start(
        2,
        &[1, 2, 3],
        ElectionState {
            epoch: 1,
            voted_for: Some(1),
            leader_id: Some(1),
        },
    );
    let fetch = sent(&node.take_actions());
    assert!(matches!(fetch[0].2, RaftRequest::Fetch(_)));
    (node, fetch[0].1)
}

fn data_response(epoch: Epoch, hw: Offset, batches: Vec<Batch>) -> RaftResponse {
    RaftResponse::Fetch(FetchResponse {
        error: ErrorCode::None,
        epoch,
        leader_id: Some(1),
        high_watermark: hw,
        log_start_offset: 0,
        diverging_epoch: None,
        snapshot_id: None,
        batches,
    })
}

#[test]
fn a_voter_fetches_again_only_after_its_flush() {
    let (node, corr) = follower_with_fetch();
    fetches_again_only_after_its_flush(node, corr);
}

#[test]
fn an_observer_fetches_again_only_after_its_flush() {
    let mut node = start(
        9,
        &[1, 2, 3],
        ElectionState {
            epoch: 1,
            voted_for: None,
            leader_id: Some(1),
        },
    );
    let fetch = sent(&node.take_actions());
    assert!(matches!(fetch[0].2, RaftRequest::Fetch(_)));
    fetches_again_only_after_its_flush(node, fetch[0].1);
}

fn fetches_again_only_after_its_flush(mut node: RaftNode, corr: u64) {
    let batch = Batch::new(0, 1, &[Record::NoOp, Record::NoOp]);
    node.handle_response(5, 1, corr, data_response(1, 2, vec![batch]));
    let actions = node.take_actions();
    assert!(actions.iter().any(|a| matches!(a, Action::AppendBatch(_))));
    assert!(actions.contains(&Action::Flush));
    assert!(
        sent(&actions).is_empty(),
        "no fetch (= acknowledgement) before the flush"
    );
    assert_eq!(node.high_watermark(), 2, "HW adopted, capped by the log end");
    node.on_flushed(6, 2);
    let fetch = sent(&node.take_actions());
    match &fetch[0].2 {
        RaftRequest::Fetch(f) => assert_eq!((f.fetch_offset, f.last_fetched_epoch), (2, 1)),
        other => panic!("{other:?}"),
    }
}

/// A Vote claims only the durable log. Like a fetch offset, the claim
/// tells other nodes what this one holds, and a crash takes back whatever
/// was not flushed.
#[test]
fn a_vote_request_names_the_flushed_log_end_not_the_log_end() {
    let (mut node, corr) = follower_with_fetch();
    node.handle_response(
        5,
        1,
        corr,
        data_response(1, 0, vec![Batch::new(0, 1, &[Record::NoOp, Record::NoOp])]),
    );
    node.on_flushed(6, 2);
    let fetch = sent(&node.take_actions());
    assert!(matches!(fetch[0].2, RaftRequest::Fetch(_)));
    // Epoch 1 [0, 2) durable; [2, 5) written, not flushed when the fetch
    // times out.
    let batch = Batch::new(2, 1, &[Record::NoOp, Record::NoOp, Record::NoOp]);
    node.handle_response(7, 1, fetch[0].1, data_response(1, 0, vec![batch]));
    assert_eq!((node.log().end_offset(), node.log().flushed_end()), (5, 2));
    node.tick(FETCH_T + 100);
    assert_eq!(node.role().role, RoleKind::Prospective);
    let votes: Vec<_> = sent(&node.take_actions())
        .into_iter()
        .filter_map(|(_, _, request)| match request {
            RaftRequest::Vote(v) => Some(v),
            _ => None,
        })
        .collect();
    assert_eq!(votes.len(), 2, "a pre-vote to each other voter");
    for vote in votes {
        assert_eq!((vote.last_epoch, vote.last_epoch_end_offset), (1, 2), "{vote:?}");
    }
}

#[test]
fn a_follower_caps_the_leaders_high_watermark_at_its_log_end() {
    let (mut node, corr) = follower_with_fetch();
    node.handle_response(
        5,
        1,
        corr,
        data_response(1, 10, vec![Batch::new(0, 1, &[Record::NoOp])]),
    );
    assert_eq!(node.high_watermark(), 1);
}

#[test]
fn a_damaged_or_misplaced_batch_is_not_written() {
    let (mut node, corr) = follower_with_fetch();
    let mut bad = Batch::new(0, 1, &[Record::NoOp]);
    bad.crc ^= 1;
    node.handle_response(5, 1, corr, data_response(1, 1, vec![bad]));
    assert!(!node.take_actions().iter().any(|a| matches!(a, Action::AppendBatch(_))));
    assert_eq!(node.log().end_offset(), 0);
    let (mut node, corr) = follower_with_fetch();
    node.handle_response(5, 1, corr, data_response(1, 1, vec![Batch::new(3, 1, &[Record::NoOp])]));
    assert_eq!(node.log().end_offset(), 0, "a gap is refused");
}

/// A batch no store would keep (over [`MAX_ENCODED_BATCH_BYTES`], possible
/// only when `listeners.max_frame_bytes` was raised) is refused like a
/// damaged one, not handed to the store, which would stop the node.
#[test]
fn a_batch_too_large_to_store_is_not_written() {
    use crate::messages::MAX_ENCODED_BATCH_BYTES;
    let (mut node, corr) = follower_with_fetch();
    let huge = Batch::new(0, 1, &[Record::Data(vec![7; MAX_ENCODED_BATCH_BYTES])]);
    assert!(huge.encoded_len() > MAX_ENCODED_BATCH_BYTES);
    node.handle_response(5, 1, corr, data_response(1, 1, vec![huge]));
    assert!(!node.take_actions().iter().any(|a| matches!(a, Action::AppendBatch(_))));
    assert_eq!(node.log().end_offset(), 0);
}

#[test]
fn a_batch_whose_offsets_run_past_the_largest_offset_is_not_written() {
    // A snapshot (from a leader that made one up) put our log end next to
    // the largest offset; two more records do not fit below it.
    let near_the_end = MAX_LOG_OFFSET - 1;
    let election = ElectionState {
        epoch: 1,
        voted_for: Some(1),
        leader_id: Some(1),
    };
    let log = LogView::new(near_the_end, 1, near_the_end, Vec::new());
    let mut node = RaftNode::new(config(2, &[1, 2, 3]), election, log, 0, 7);
    let (_, corr, _) = sent(&node.take_actions()).pop().expect("a fetch");
    let past = Batch::new(near_the_end, 1, &[Record::NoOp, Record::NoOp]);
    node.handle_response(5, 1, corr, data_response(1, near_the_end, vec![past]));
    assert!(!node.take_actions().iter().any(|a| matches!(a, Action::AppendBatch(_))));
    assert_eq!(node.log().end_offset(), near_the_end);
    // One record fits: the log may end at the largest offset itself.
    node.tick(1_000);
    let (_, corr, _) = sent(&node.take_actions()).pop().expect("a fetch again");
    let last = Batch::new(near_the_end, 1, &[Record::NoOp]);
    node.handle_response(1_001, 1, corr, data_response(1, near_the_end, vec![last]));
    assert_eq!(node.log().end_offset(), MAX_LOG_OFFSET);
}

#[test]
fn a_log_at_the_largest_offset_takes_no_more_records() {
    // The single voter leads over a log that ends one record below the
    // bound (only a snapshot id a leader made up brings it here).
    let end = MAX_LOG_OFFSET - 1;
    let election = ElectionState {
        epoch: 3,
        voted_for: Some(1),
        leader_id: Some(1),
    };
    let log = LogView::new(end - 1, 3, end, vec![(3, end - 1)]);
    let mut node = RaftNode::new(config(1, &[1]), election, log, 0, 7);
    // Its LeaderChange record takes the last offset.
    let appended = appended_batches(node.take_actions());
    assert_eq!(appended.iter().map(|b| b.base_offset).collect::<Vec<_>>(), vec![end]);
    assert_eq!(
        node.propose(1, vec![Record::NoOp]),
        Err(ProposeError::LogFull {
            next_offset: MAX_LOG_OFFSET
        })
    );
    node.tick(10 * T);
    assert!(
        appended_batches(node.take_actions()).is_empty(),
        "no NoOp past the bound"
    );
    assert_eq!(node.log().end_offset(), MAX_LOG_OFFSET);
}

#[test]
fn a_snapshot_id_past_the_largest_offset_is_refused() {
    for (end_offset, fetched) in [(MAX_LOG_OFFSET + 1, false), (MAX_LOG_OFFSET, true)] {
        let (mut node, corr) = follower_with_fetch();
        let mut response = data_response(1, 0, vec![]);
        if let RaftResponse::Fetch(f) = &mut response {
            f.snapshot_id = Some(SnapshotId { end_offset, epoch: 1 });
        }
        node.handle_response(5, 1, corr, response);
        node.tick(5 + 1_000);
        let asked = sent(&node.take_actions())
            .iter()
            .any(|(_, _, r)| matches!(r, RaftRequest::FetchSnapshot(_)));
        assert_eq!(asked, fetched, "snapshot ending at {end_offset}");
    }
}

#[test]
fn divergence_truncates_to_the_common_prefix() {
    // Follower: epoch 1 [0,3), epoch 2 [3,6). Leader says epoch 1 ends at 3.
    let log = log_of(&[(1, 0), (2, 3)], 6);
    let mut node = RaftNode::new(
        config(2, &[1, 2, 3]),
        ElectionState {
            epoch: 3,
            voted_for: None,
            leader_id: Some(1),
        },
        log,
        0,
        1,
    );
    let fetch = sent(&node.take_actions());
    let corr = fetch[0].1;
    let mut resp = FetchResponse {
        error: ErrorCode::None,
        epoch: 3,
        leader_id: Some(1),
        high_watermark: 2,
        log_start_offset: 0,
        diverging_epoch: Some(DivergingEpoch {
            epoch: 1,
            end_offset: 3,
        }),
        snapshot_id: None,
        batches: vec![],
    };
    node.handle_response(1, 1, corr, RaftResponse::Fetch(resp.clone()));
    let actions = node.take_actions();
    assert!(actions.contains(&Action::Truncate { end_offset: 3 }));
    assert_eq!(node.log().end_offset(), 3);
    let fetch = sent(&actions);
    match &fetch[0].2 {
        RaftRequest::Fetch(f) => assert_eq!((f.fetch_offset, f.last_fetched_epoch), (3, 1)),
        other => panic!("{other:?}"),
    }
    // Never below the high watermark.
    node.handle_response(2, 1, fetch[0].1, data_response(3, 3, vec![]));
    assert_eq!(node.high_watermark(), 3);
    let fetch = sent(&node.take_actions());
    resp.diverging_epoch = Some(DivergingEpoch {
        epoch: 1,
        end_offset: 1,
    });
    node.handle_response(101, 1, fetch[0].1, RaftResponse::Fetch(resp));
    assert!(!node.take_actions().iter().any(|a| matches!(a, Action::Truncate { .. })));
    assert_eq!(node.log().end_offset(), 3);
}

/// The leader's diverging epoch may end later in its log than in ours:
/// what we wrote after our end of that epoch (a later epoch, which the
/// leader never had) goes, so we cut at our own end of it.
#[test]
fn divergence_cuts_at_our_end_of_the_epoch_when_the_leaders_ends_later() {
    // Follower: epoch 1 [0,3), epoch 2 [3,6). The leader's epoch 1 runs to 5.
    let log = log_of(&[(1, 0), (2, 3)], 6);
    let election = ElectionState {
        epoch: 3,
        voted_for: None,
        leader_id: Some(1),
    };
    let mut node = RaftNode::new(config(2, &[1, 2, 3]), election, log, 0, 1);
    let (_, corr, _) = sent(&node.take_actions()).pop().expect("a fetch");
    let resp = FetchResponse {
        error: ErrorCode::None,
        epoch: 3,
        leader_id: Some(1),
        high_watermark: 0,
        log_start_offset: 0,
        diverging_epoch: Some(DivergingEpoch {
            epoch: 1,
            end_offset: 5,
        }),
        snapshot_id: None,
        batches: vec![],
    };
    node.handle_response(1, 1, corr, RaftResponse::Fetch(resp));
    assert!(node.take_actions().contains(&Action::Truncate { end_offset: 3 }));
    assert_eq!((node.log().end_offset(), node.log().last_epoch()), (3, 1));
}

#[test]
fn a_follower_without_fetches_becomes_prospective() {
    let (mut node, _) = follower_with_fetch();
    node.tick(FETCH_T - 1);
    assert_eq!(node.role().role, RoleKind::Follower);
    node.tick(FETCH_T);
    assert_eq!(node.role().role, RoleKind::Prospective);
    assert_eq!(node.role().epoch, 1);
}

#[test]
fn proposals_to_a_follower_name_the_leader() {
    let (mut node, _) = follower_with_fetch();
    assert_eq!(
        node.propose(1, vec![Record::NoOp]),
        Err(ProposeError::NotLeader {
            leader_id: Some(1),
            epoch: 1
        })
    );
}

#[test]
fn a_flush_does_not_cover_a_truncation_issued_after_it() {
    let (mut node, corr) = follower_with_fetch();
    node.handle_response(
        5,
        1,
        corr,
        data_response(
            1,
            0,
            vec![Batch::new(0, 1, &[Record::NoOp, Record::NoOp, Record::NoOp])],
        ),
    );
    node.take_actions(); // Flush in flight for end 3
    node.truncate_log(1);
    node.log.append(1, 2, 2);
    node.on_flushed(6, 2);
    assert_eq!(
        node.log().flushed_end(),
        1,
        "offset 1 of epoch 2 was written after the flush began"
    );
}

// ---------------------------------------------------------------- observers

#[test]
fn an_observer_never_campaigns_and_finds_the_leader_by_fetching() {
    let mut node = start(9, &[1, 2, 3], ElectionState::default());
    let fetch = sent(&node.take_actions());
    assert_eq!(fetch.len(), 1);
    let (to, corr, _) = fetch[0].clone();
    node.tick(10 * T);
    assert_eq!(
        node.role().role,
        RoleKind::Unattached,
        "no election timeout for observers"
    );
    node.handle_response(
        10 * T,
        to,
        corr,
        RaftResponse::Fetch(FetchResponse {
            error: ErrorCode::NotLeaderOrFollower,
            epoch: 3,
            leader_id: Some(2),
            high_watermark: 0,
            log_start_offset: 0,
            diverging_epoch: None,
            snapshot_id: None,
            batches: vec![],
        }),
    );
    assert_eq!((node.role().role, node.role().leader_id), (RoleKind::Follower, Some(2)));
    node.handle_request(10 * T, 1, 1, vote_req(4, 1, 9, 9, false));
    assert!(!granted(&node.take_actions()), "observers do not vote");
}

#[test]
fn next_deadline_skips_timers_that_cannot_act() {
    // A follower with a fetch in flight must not ask to be ticked for its
    // (already due) next fetch, or its shell would spin.
    let (mut node, _) = follower_with_fetch();
    assert_eq!(node.next_deadline_ms(), FETCH_T);
    // A leader with a flush in flight and records waiting (linger 0) waits
    // for the flush, not for its idle timer.
    let (mut leader, now) = elect_leader();
    leader.take_actions();
    leader.propose(now, vec![Record::NoOp]).unwrap();
    leader.tick(now + 600);
    assert!(leader.next_deadline_ms() > now + 600);
    node.tick(FETCH_T - 1);
    assert_eq!(node.role().role, RoleKind::Follower);
}

#[test]
fn a_single_voter_that_resigns_stays_resigned_until_restart() {
    let mut node = start(1, &[1], ElectionState::default());
    assert_eq!(node.role().role, RoleKind::Leader);
    node.resign(5);
    assert_eq!(
        node.role().role,
        RoleKind::Resigned,
        "shutting down must not re-elect itself"
    );
    let restarted = start(1, &[1], node.election_state().clone());
    assert_eq!((restarted.role().role, restarted.role().epoch), (RoleKind::Leader, 2));
}

#[test]
fn a_deposed_leader_never_names_itself_in_answers_to_parked_fetches() {
    let (mut node, now) = elect_leader();
    node.on_flushed(now, 1);
    node.handle_request(now, 2, 1, fetch_req(2, 1, 1, 1, 500));
    node.handle_request(now, 2, 2, fetch_req(2, 1, 1, 1, 500)); // parked
    node.take_actions();
    node.handle_request(now + 1, 3, 3, vote_req(2, 3, 9, 9, false));
    let actions = node.take_actions();
    let answer = actions.iter().find_map(|a| match a {
        Action::RespondFetch {
            request_id: 2,
            response,
            ..
        } => Some(response.clone()),
        _ => None,
    });
    let answer = answer.expect("the parked fetch is answered");
    assert_eq!(answer.epoch, 2);
    assert_eq!(answer.leader_id, None, "node 1 is not the leader of epoch 2");
}

#[test]
fn divergence_in_an_epoch_we_do_not_hold_cuts_only_above_our_older_epoch() {
    // Follower: epoch 1 [0,3), epoch 2 [3,6) (one batch), epoch 4 [6,8).
    // The leader has no epoch 4; its epoch 3 ends at 4. Our log has no
    // epoch 3, and offset 4 lies inside our epoch-2 batch: cut only epoch 4,
    // never into records that may agree (and may be committed).
    let log = log_of(&[(1, 0), (2, 3), (4, 6)], 8);
    let mut node = RaftNode::new(
        config(2, &[1, 2, 3]),
        ElectionState {
            epoch: 5,
            voted_for: None,
            leader_id: Some(1),
        },
        log,
        0,
        1,
    );
    let corr = sent(&node.take_actions())[0].1;
    let resp = FetchResponse {
        error: ErrorCode::None,
        epoch: 5,
        leader_id: Some(1),
        high_watermark: 0,
        log_start_offset: 0,
        diverging_epoch: Some(DivergingEpoch {
            epoch: 3,
            end_offset: 4,
        }),
        snapshot_id: None,
        batches: vec![],
    };
    node.handle_response(1, 1, corr, RaftResponse::Fetch(resp));
    let actions = node.take_actions();
    assert!(actions.contains(&Action::Truncate { end_offset: 6 }), "{actions:?}");
    match &sent(&actions)[0].2 {
        RaftRequest::Fetch(f) => assert_eq!(
            (f.fetch_offset, f.last_fetched_epoch),
            (6, 2),
            "the next fetch names the older epoch"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_leader_tracks_a_bounded_number_of_observers() {
    let (mut node, now) = elect_leader();
    node.on_flushed(now, 1);
    for id in 0..node::MAX_OBSERVERS as NodeId {
        node.handle_request(now, 100 + id, id as u64, fetch_req(100 + id, 1, 0, 0, 0));
    }
    node.take_actions();
    node.handle_request(now, 5000, 1, fetch_req(5000, 1, 0, 0, 0));
    match responses(&node.take_actions()).last() {
        Some(RaftResponse::Fetch(f)) => assert_eq!(f.error, ErrorCode::BrokerNotAvailable),
        other => panic!("{other:?}"),
    }
    assert_eq!(node.describe(now).observers.len(), node::MAX_OBSERVERS);
    // A voter is always served.
    node.handle_request(now, 2, 2, fetch_req(2, 1, 1, 1, 0));
    match responses(&node.take_actions()).last() {
        Some(RaftResponse::Fetch(f)) => assert_eq!(f.error, ErrorCode::None),
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------- snapshots (KIP-630)

const SNAPSHOT: SnapshotId = SnapshotId {
    end_offset: 100,
    epoch: 2,
};

/// The single voter 1 leading epoch 4 over a log that starts at the end of
/// [`SNAPSHOT`] (everything below was compacted into it).
fn leader_with_snapshot() -> (RaftNode, Epoch) {
    let election = ElectionState {
        epoch: 3,
        voted_for: Some(1),
        leader_id: Some(1),
    };
    let log = LogView::new(100, 2, 150, vec![(3, 120)]);
    let mut node = RaftNode::new(config(1, &[1]), election, log, 0, 7);
    node.on_snapshot_created(0, SNAPSHOT);
    assert_eq!(node.role().role, RoleKind::Leader);
    node.take_actions();
    let epoch = node.role().epoch;
    (node, epoch)
}

fn fetch_response(actions: &[Action]) -> FetchResponse {
    match responses(actions).last() {
        Some(RaftResponse::Fetch(f)) => f.clone(),
        other => panic!("no fetch response: {other:?}"),
    }
}

#[test]
fn a_fetch_below_the_log_start_is_sent_to_the_snapshot() {
    let (mut node, epoch) = leader_with_snapshot();
    node.handle_request(1, 7, 1, fetch_req(7, epoch, 50, 1, 0));
    let response = fetch_response(&node.take_actions());
    assert_eq!((response.snapshot_id, response.diverging_epoch), (Some(SNAPSHOT), None));
    assert!(response.batches.is_empty());

    // At the log start, but with another epoch there: also the snapshot.
    node.handle_request(2, 7, 2, fetch_req(7, epoch, 100, 1, 0));
    assert_eq!(fetch_response(&node.take_actions()).snapshot_id, Some(SNAPSHOT));

    // At the log start with the snapshot's epoch: the log itself.
    node.handle_request(3, 7, 3, fetch_req(7, epoch, 100, 2, 0));
    let actions = node.take_actions();
    let response = fetch_response(&actions);
    assert_eq!((response.snapshot_id, response.diverging_epoch), (None, None));
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::RespondFetch { read: Some(r), .. } if r.from == 100)));
}

#[test]
fn a_diverging_fetch_that_would_truncate_into_the_snapshot_gets_the_snapshot() {
    let (mut node, epoch) = leader_with_snapshot();
    // Offset 130 in epoch 1: our epoch 1 ended below the log start.
    node.handle_request(1, 7, 1, fetch_req(7, epoch, 130, 1, 0));
    assert_eq!(fetch_response(&node.take_actions()).snapshot_id, Some(SNAPSHOT));
    // Offset 130 in epoch 3: it agrees with us; no snapshot, no divergence.
    node.handle_request(2, 7, 2, fetch_req(7, epoch, 130, 3, 0));
    let response = fetch_response(&node.take_actions());
    assert_eq!((response.snapshot_id, response.diverging_epoch), (None, None));
}

#[test]
fn the_leader_serves_only_its_latest_snapshot() {
    let (mut node, epoch) = leader_with_snapshot();
    let fetch_snapshot = |id: SnapshotId, epoch: Epoch| {
        RaftRequest::FetchSnapshot(FetchSnapshotRequest {
            replica_id: 7,
            current_epoch: epoch,
            snapshot_id: id,
            position: 4096,
            max_bytes: u32::MAX,
        })
    };
    node.handle_request(1, 7, 1, fetch_snapshot(SNAPSHOT, epoch));
    match node.take_actions().as_slice() {
        [Action::RespondFetchSnapshot {
            to: 7,
            request_id: 1,
            response,
            max_bytes,
        }] => {
            assert_eq!(
                (response.error, response.snapshot_id, response.position),
                (ErrorCode::None, SNAPSHOT, 4096)
            );
            assert_eq!(*max_bytes, SNAPSHOT_CHUNK_MAX_BYTES, "chunks are at most 1 MiB");
        }
        other => panic!("{other:?}"),
    }
    // A fetcher asking for less gets no more than it asked for.
    let small = RaftRequest::FetchSnapshot(FetchSnapshotRequest {
        replica_id: 7,
        current_epoch: epoch,
        snapshot_id: SNAPSHOT,
        position: 0,
        max_bytes: 4096,
    });
    node.handle_request(1, 7, 9, small);
    assert!(
        matches!(
            node.take_actions().as_slice(),
            [Action::RespondFetchSnapshot { max_bytes: 4096, .. }]
        ),
        "a small ask is kept"
    );
    let older = SnapshotId {
        end_offset: 60,
        epoch: 1,
    };
    let cases = [
        (fetch_snapshot(older, epoch), ErrorCode::SnapshotNotFound),
        (fetch_snapshot(SNAPSHOT, epoch - 1), ErrorCode::FencedLeaderEpoch),
        (fetch_snapshot(SNAPSHOT, epoch + 1), ErrorCode::UnknownLeaderEpoch),
    ];
    for (i, (request, expected)) in cases.into_iter().enumerate() {
        node.handle_request(2, 7, 2 + i as u64, request);
        match responses(&node.take_actions()).last() {
            Some(RaftResponse::FetchSnapshot(r)) => assert_eq!(r.error, expected),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_node_restarted_over_a_compacted_log_announces_the_high_watermark_at_its_start() {
    // Everything below the log start is in a snapshot, hence committed; the
    // listeners (which start at offset 0) learn it without a new commit.
    let election = ElectionState {
        epoch: 2,
        voted_for: None,
        leader_id: Some(2),
    };
    let mut node = RaftNode::new(
        config(1, &[1, 2, 3]),
        election,
        LogView::new(100, 2, 100, Vec::new()),
        0,
        7,
    );
    assert_eq!(node.high_watermark(), 100);
    assert!(node.take_actions().contains(&Action::HighWatermark(100)));
    let mut fresh = start(1, &[1, 2, 3], ElectionState::default());
    assert!(!fresh
        .take_actions()
        .iter()
        .any(|a| matches!(a, Action::HighWatermark(_))));
}

#[test]
fn a_snapshot_past_the_high_watermark_is_never_registered() {
    let mut node = start(1, &[1, 2, 3], ElectionState::default());
    node.on_snapshot_created(
        0,
        SnapshotId {
            end_offset: 5,
            epoch: 1,
        },
    );
    assert_eq!(node.latest_snapshot(), None);
}

/// Node 1 follows leader 2 in epoch 5 over an old log of 10 records.
/// Node 1 of {1, 2, 3}, following leader 2 in epoch 5, its log [0, 10)
/// of epoch 1; its first fetch is among its actions.
fn follower_of_2_in_epoch_5() -> RaftNode {
    let election = ElectionState {
        epoch: 5,
        voted_for: None,
        leader_id: Some(2),
    };
    RaftNode::new(config(1, &[1, 2, 3]), election, log_of(&[(1, 0)], 10), 0, 7)
}

fn follower_behind_the_log_start() -> RaftNode {
    let mut node = follower_of_2_in_epoch_5();
    assert_eq!(node.role().role, RoleKind::Follower);
    let actions = node.take_actions();
    let (to, corr, request) = sent(&actions).pop().expect("a fetch");
    assert!(matches!(request, RaftRequest::Fetch(_)));
    node.handle_response(1, to, corr, snapshot_needed());
    node
}

fn chunk(position: u64, len: usize, size: u64) -> RaftResponse {
    RaftResponse::FetchSnapshot(FetchSnapshotResponse {
        error: ErrorCode::None,
        epoch: 5,
        leader_id: Some(2),
        snapshot_id: SnapshotId {
            end_offset: 200,
            epoch: 4,
        },
        size,
        position,
        bytes: vec![7; len],
    })
}

fn next_request(node: &mut RaftNode) -> (u64, RaftRequest) {
    let (_, corr, request) = sent(&node.take_actions()).pop().expect("a request");
    (corr, request)
}

#[test]
fn a_follower_fetches_the_snapshot_in_chunks_installs_it_then_fetches_the_log() {
    let mut node = follower_behind_the_log_start();
    let id = SnapshotId {
        end_offset: 200,
        epoch: 4,
    };
    let (corr, request) = next_request(&mut node);
    match &request {
        RaftRequest::FetchSnapshot(r) => assert_eq!((r.snapshot_id, r.position, r.current_epoch), (id, 0, 5)),
        other => panic!("{other:?}"),
    }
    node.handle_response(2, 2, corr, chunk(0, 10, 25));
    let actions = node.take_actions();
    assert!(matches!(
        &actions[0],
        Action::WriteSnapshotChunk { position: 0, size: 25, bytes, .. } if bytes.len() == 10
    ));
    let (corr, request) = sent(&actions)
        .pop()
        .map(|(_, c, r)| (c, r))
        .expect("the next chunk is asked for");
    assert!(
        matches!(request, RaftRequest::FetchSnapshot(ref r) if r.position == 10),
        "resumes at 10: {request:?}"
    );

    node.handle_response(3, 2, corr, chunk(10, 15, 25));
    let actions = node.take_actions();
    let install = position(&actions, |a| matches!(a, Action::InstallSnapshot(i) if *i == id));
    assert!(
        install
            > position(&actions, |a| matches!(
                a,
                Action::WriteSnapshotChunk { position: 10, .. }
            ))
    );
    assert!(
        sent(&actions).is_empty(),
        "nothing is fetched while the snapshot installs"
    );
    node.tick(4);
    assert!(sent(&node.take_actions()).is_empty());

    node.on_snapshot_installed(5, id).unwrap();
    let actions = node.take_actions();
    assert_eq!((node.log().start_offset(), node.log().end_offset()), (200, 200));
    assert_eq!(node.high_watermark(), 200);
    assert_eq!(node.latest_snapshot(), Some(id));
    assert!(actions.contains(&Action::HighWatermark(200)));
    match sent(&actions).pop() {
        Some((2, _, RaftRequest::Fetch(f))) => assert_eq!((f.fetch_offset, f.last_fetched_epoch), (200, 4)),
        other => panic!("expected a fetch from the snapshot's end: {other:?}"),
    }
}

#[test]
fn a_bad_chunk_or_a_vanished_snapshot_restarts_from_a_fetch() {
    for bad in [chunk(5, 10, 25), chunk(0, 30, 25), {
        let mut gone = chunk(0, 0, 0);
        if let RaftResponse::FetchSnapshot(r) = &mut gone {
            r.error = ErrorCode::SnapshotNotFound;
        }
        gone
    }] {
        let mut node = follower_behind_the_log_start();
        let (corr, _) = next_request(&mut node);
        node.handle_response(2, 2, corr, bad.clone());
        let actions = node.take_actions();
        assert!(!takes_a_chunk(&actions), "{bad:?} is not written");
        node.tick(1_000);
        let (_, request) = next_request(&mut node);
        assert!(matches!(request, RaftRequest::Fetch(_)), "after {bad:?}: {request:?}");
    }
}

/// An answer about another snapshot than the one being fetched (the
/// leader's newer one, say) belongs to no request of this transfer:
/// nothing of it is written.
/// An answer of another kind than its request (a FetchSnapshot answer to a
/// Fetch) is a failed request: the follower backs off before it fetches
/// again, and takes nothing from it.
#[test]
fn an_answer_of_another_kind_than_its_request_is_a_failed_request() {
    let mut node = follower_of_2_in_epoch_5();
    let (to, corr, _) = sent(&node.take_actions()).pop().expect("a fetch");
    node.handle_response(1, to, corr, chunk(0, 10, 25));
    node.tick(1);
    let actions = node.take_actions();
    assert!(sent(&actions).is_empty(), "backs off: {actions:?}");
    node.tick(1 + config(1, &[1, 2, 3]).retry_backoff_ms);
    let next = sent(&node.take_actions());
    assert!(matches!(next.as_slice(), [(2, _, RaftRequest::Fetch(_))]), "{next:?}");
}

/// The role names `/v1/quorum`, `/healthz`, the metrics and the logs show
/// operators (and the tests of whole nodes look for).
#[test]
fn role_names_are_the_ones_operators_see() {
    let kinds = [
        RoleKind::Unattached,
        RoleKind::Prospective,
        RoleKind::Candidate,
        RoleKind::Leader,
        RoleKind::Follower,
        RoleKind::Resigned,
    ];
    assert_eq!(
        kinds.map(RoleKind::as_str),
        [
            "unattached",
            "prospective",
            "candidate",
            "leader",
            "follower",
            "resigned"
        ]
    );
}

/// A late answer (its request already failed) still teaches a higher
/// epoch, a BeginQuorumEpoch or EndQuorumEpoch answer as any other.
#[test]
fn a_late_quorum_epoch_answer_still_teaches_a_higher_epoch() {
    for end in [false, true] {
        let (mut node, now) = elect_leader();
        let (to, corr, _) = sent(&node.take_actions())
            .into_iter()
            .find(|(_, _, r)| matches!(r, RaftRequest::BeginQuorumEpoch(_)))
            .expect("a BeginQuorumEpoch");
        node.handle_request_failed(now, to, corr);
        let answer = QuorumEpochResponse {
            error: ErrorCode::None,
            epoch: 4,
            leader_id: Some(3),
        };
        let late = if end {
            RaftResponse::EndQuorumEpoch(answer)
        } else {
            RaftResponse::BeginQuorumEpoch(answer)
        };
        node.handle_response(now + 1, to, corr, late);
        assert_eq!((node.role().role, node.role().epoch), (RoleKind::Follower, 4));
    }
}

/// Only an answer to the resignation's own EndQuorumEpoch acknowledges it:
/// an answer shaped so to a request sent while leading (a
/// BeginQuorumEpoch) leaves that voter still to be told.
#[test]
fn only_an_answer_to_the_resignations_own_request_acknowledges_it() {
    let (mut node, now) = elect_leader();
    let (_, begin_2, _) = sent(&node.take_actions())
        .into_iter()
        .find(|(to, _, r)| *to == 2 && matches!(r, RaftRequest::BeginQuorumEpoch(_)))
        .expect("a BeginQuorumEpoch to 2");
    node.resign(now + 1);
    let (_, end_3, _) = sent(&node.take_actions())
        .into_iter()
        .find(|(to, _, r)| *to == 3 && matches!(r, RaftRequest::EndQuorumEpoch(_)))
        .expect("an EndQuorumEpoch to 3");
    let answer = || {
        RaftResponse::EndQuorumEpoch(QuorumEpochResponse {
            error: ErrorCode::None,
            epoch: 1,
            leader_id: None,
        })
    };
    node.handle_response(now + 2, 3, end_3, answer());
    node.handle_response(now + 2, 2, begin_2, answer());
    assert_eq!(node.role().role, RoleKind::Resigned);
    let retry = config(1, &[1, 2, 3]).retry_backoff_ms;
    assert!(
        node.next_deadline_ms() <= now + 1 + retry,
        "voter 2 is asked again: {}",
        node.next_deadline_ms()
    );
}

/// A voter that acknowledged the resignation is not told again; one whose
/// answer was an error is, once the retry backoff has passed.
#[test]
fn a_resignation_is_sent_again_only_to_the_voters_that_did_not_acknowledge_it() {
    let (mut node, now) = elect_leader();
    node.take_actions();
    node.resign(now + 1);
    let told: BTreeMap<NodeId, u64> = sent(&node.take_actions())
        .into_iter()
        .filter(|(_, _, r)| matches!(r, RaftRequest::EndQuorumEpoch(_)))
        .map(|(to, corr, _)| (to, corr))
        .collect();
    assert_eq!(told.keys().copied().collect::<Vec<_>>(), vec![2, 3]);
    let answer = |error| {
        RaftResponse::EndQuorumEpoch(QuorumEpochResponse {
            error,
            epoch: 1,
            leader_id: None,
        })
    };
    node.handle_response(now + 2, 2, told[&2], answer(ErrorCode::BrokerNotAvailable));
    node.handle_response(now + 2, 3, told[&3], answer(ErrorCode::None));
    node.tick(now + 2 + node.config().retry_backoff_ms.max(1));
    assert_eq!(node.role().role, RoleKind::Resigned);
    let again: Vec<NodeId> = sent(&node.take_actions())
        .into_iter()
        .filter(|(_, _, r)| matches!(r, RaftRequest::EndQuorumEpoch(_)))
        .map(|(to, _, _)| to)
        .collect();
    assert_eq!(
        again,
        vec![2],
        "only the voter that has not acknowledged it is told again"
    );
}

/// A chunk answering a FetchSnapshot sent in an earlier role is not taken,
/// even for the snapshot fetched now from the same leader: here the
/// leader resigned (EndQuorumEpoch), the pre-votes were refused in its
/// name, and this node went back to following it.
#[test]
fn a_chunk_answering_a_request_of_an_earlier_role_is_ignored() {
    let mut node = follower_behind_the_log_start();
    let (stale, _) = next_request(&mut node);
    node.handle_request(2, 2, 1, end_req(5, 2, vec![1]));
    for (to, corr, _) in sent(&node.take_actions())
        .into_iter()
        .filter(|(_, _, r)| matches!(r, RaftRequest::Vote(_)))
    {
        node.handle_response(
            3,
            to,
            corr,
            RaftResponse::Vote(VoteResponse {
                error: ErrorCode::None,
                epoch: 5,
                leader_id: Some(2),
                vote_granted: false,
                pre_vote: true,
            }),
        );
    }
    assert_eq!((node.role().role, node.role().leader_id), (RoleKind::Follower, Some(2)));
    let (corr, _) = next_request(&mut node);
    node.handle_response(4, 2, corr, snapshot_needed());
    let (_, request) = next_request(&mut node);
    assert!(
        matches!(request, RaftRequest::FetchSnapshot(ref r) if r.position == 0),
        "{request:?}"
    );
    node.handle_response(5, 2, stale, chunk(0, 10, 25));
    let actions = node.take_actions();
    assert!(!takes_a_chunk(&actions), "{actions:?}");
}

#[test]
fn a_chunk_of_another_snapshot_is_ignored() {
    let mut node = follower_behind_the_log_start();
    let (corr, _) = next_request(&mut node);
    let mut other = chunk(0, 10, 25);
    if let RaftResponse::FetchSnapshot(r) = &mut other {
        r.snapshot_id.end_offset = 250;
    }
    node.handle_response(2, 2, corr, other);
    let actions = node.take_actions();
    assert!(!takes_a_chunk(&actions), "{actions:?}");
}

#[test]
fn a_chunk_that_changes_the_snapshots_size_restarts_from_a_fetch() {
    let mut node = follower_behind_the_log_start();
    let (corr, _) = next_request(&mut node);
    node.handle_response(2, 2, corr, chunk(0, 10, 25));
    // In order, and within the size it gives, but the first chunk said 25:
    // these bytes belong to another file than the ones written.
    let (corr, _) = next_request(&mut node);
    node.handle_response(3, 2, corr, chunk(10, 10, 20));
    let actions = node.take_actions();
    assert!(
        !takes_a_chunk(&actions),
        "a chunk of another size is neither written nor installed: {actions:?}"
    );
    node.tick(1_000);
    let (_, request) = next_request(&mut node);
    assert!(matches!(request, RaftRequest::Fetch(_)), "{request:?}");
}

#[test]
fn a_failed_install_fetches_the_snapshot_again() {
    let mut node = follower_behind_the_log_start();
    let id = SnapshotId {
        end_offset: 200,
        epoch: 4,
    };
    let (corr, _) = next_request(&mut node);
    node.handle_response(2, 2, corr, chunk(0, 25, 25));
    node.take_actions();
    node.on_snapshot_install_failed(3, id).unwrap();
    assert_eq!(node.log().end_offset(), 10, "the old log is kept");
    node.tick(1_000);
    let (_, request) = next_request(&mut node);
    assert!(
        matches!(request, RaftRequest::Fetch(ref f) if f.fetch_offset == 10),
        "{request:?}"
    );
}

/// The Fetch answer of a leader whose log starts at its snapshot 200@4.
fn snapshot_needed() -> RaftResponse {
    leader_2_answer(
        300,
        200,
        Some(SnapshotId {
            end_offset: 200,
            epoch: 4,
        }),
    )
}

/// A batchless Fetch answer of leader 2 in epoch 5.
fn leader_2_answer(high_watermark: Offset, log_start_offset: Offset, snapshot_id: Option<SnapshotId>) -> RaftResponse {
    RaftResponse::Fetch(FetchResponse {
        error: ErrorCode::None,
        epoch: 5,
        leader_id: Some(2),
        high_watermark,
        log_start_offset,
        diverging_epoch: None,
        snapshot_id,
        batches: Vec::new(),
    })
}

#[test]
fn installs_that_keep_failing_wait_longer_and_longer_before_the_next_transfer() {
    let mut node = follower_behind_the_log_start();
    let id = SnapshotId {
        end_offset: 200,
        epoch: 4,
    };
    let backoff = node.config().retry_backoff_ms;
    let cap = node.config().fetch_timeout_ms / 2;
    let mut now = 2;
    let mut waits = Vec::new();
    for _ in 0..8 {
        let (corr, request) = next_request(&mut node);
        assert!(matches!(request, RaftRequest::FetchSnapshot(_)), "{request:?}");
        node.handle_response(now, 2, corr, chunk(0, 25, 25));
        assert!(node.take_actions().contains(&Action::InstallSnapshot(id)));
        node.on_snapshot_install_failed(now, id).unwrap();
        node.take_actions();
        let failed_at = now;
        // The next transfer starts with a Fetch, sent once the wait is over.
        loop {
            now += 1;
            node.tick(now);
            if let Some((_, corr, request)) = sent(&node.take_actions()).pop() {
                assert!(matches!(request, RaftRequest::Fetch(_)), "{request:?}");
                node.handle_response(now, 2, corr, snapshot_needed());
                break;
            }
        }
        waits.push(now - failed_at);
        assert_eq!(node.role().role, RoleKind::Follower);
    }
    let expected: Vec<u64> = (0..8).map(|i| (backoff << i).min(cap)).collect();
    assert_eq!(waits, expected);
    // An install that succeeds starts the count again: the next failure
    // (of a newer snapshot) waits one retry backoff.
    let (corr, _) = next_request(&mut node);
    node.handle_response(now, 2, corr, chunk(0, 25, 25));
    node.take_actions();
    node.on_snapshot_installed(now, id).unwrap();
    let newer = SnapshotId {
        end_offset: 400,
        epoch: 5,
    };
    let (corr, request) = next_request(&mut node);
    assert!(
        matches!(request, RaftRequest::Fetch(ref f) if f.fetch_offset == 200),
        "{request:?}"
    );
    let RaftResponse::Fetch(mut moved_on) = snapshot_needed() else {
        unreachable!()
    };
    moved_on.log_start_offset = 400;
    moved_on.snapshot_id = Some(newer);
    node.handle_response(now, 2, corr, RaftResponse::Fetch(moved_on));
    let (corr, _) = next_request(&mut node);
    let RaftResponse::FetchSnapshot(mut newer_chunk) = chunk(0, 25, 25) else {
        unreachable!()
    };
    newer_chunk.snapshot_id = newer;
    node.handle_response(now, 2, corr, RaftResponse::FetchSnapshot(newer_chunk));
    assert!(node.take_actions().contains(&Action::InstallSnapshot(newer)));
    node.on_snapshot_install_failed(now, newer).unwrap();
    node.take_actions();
    node.tick(now + backoff - 1);
    assert!(sent(&node.take_actions()).is_empty());
    node.tick(now + backoff);
    assert!(
        !sent(&node.take_actions()).is_empty(),
        "one retry backoff after a success"
    );
}

/// The follower of [`follower_behind_the_log_start`] with the whole
/// snapshot received and `InstallSnapshot` emitted at time 2.
fn follower_installing() -> (RaftNode, SnapshotId) {
    let mut node = follower_behind_the_log_start();
    let id = SnapshotId {
        end_offset: 200,
        epoch: 4,
    };
    let (corr, _) = next_request(&mut node);
    node.handle_response(2, 2, corr, chunk(0, 25, 25));
    assert!(node.take_actions().contains(&Action::InstallSnapshot(id)));
    (node, id)
}

#[test]
fn an_install_slower_than_the_fetch_timeout_leaves_a_follower_that_fetches() {
    // The time the install took was this node's own disk, not the
    // leader's silence: the fetch timeout runs again from the install.
    let (mut node, id) = follower_installing();
    let fetch_timeout = node.config().fetch_timeout_ms;
    let done = 2 + fetch_timeout + 500;
    node.on_snapshot_installed(done, id).unwrap();
    let actions = node.take_actions();
    assert_eq!(node.role().role, RoleKind::Follower);
    match sent(&actions).pop() {
        Some((2, _, RaftRequest::Fetch(f))) => assert_eq!(f.fetch_offset, 200),
        other => panic!("expected a fetch from the snapshot's end: {other:?}"),
    }
    node.tick(done + fetch_timeout - 1);
    assert_eq!(node.role().role, RoleKind::Follower);
    node.tick(done + fetch_timeout);
    assert_eq!(
        node.role().role,
        RoleKind::Prospective,
        "a leader silent for the fetch timeout after the install is presumed gone"
    );
}

/// Every successful answer from the leader restarts the fetch timeout
/// (Kafka's `resetFetchTimeoutForSuccessfulFetch`): a follower that keeps
/// hearing from its leader never campaigns, whatever the answer carried.
#[test]
fn every_kind_of_successful_fetch_answer_restarts_the_fetch_timeout() {
    let timeout = RaftConfig::new(1, BTreeMap::new(), String::new()).fetch_timeout_ms;
    // Each case: a follower, and the time of the successful answer it got.
    let mut cases: Vec<(&str, RaftNode, u64)> = Vec::new();

    let (mut node, corr) = follower_with_fetch();
    node.handle_response(timeout - 1, 1, corr, data_response(1, 0, vec![]));
    cases.push(("an answer with no batches", node, timeout - 1));

    let (mut node, corr) = follower_with_fetch();
    let batch = Batch::new(0, 1, &[Record::NoOp]);
    node.handle_response(timeout - 1, 1, corr, data_response(1, 0, vec![batch]));
    cases.push(("an answer with batches", node, timeout - 1));

    let election = ElectionState {
        epoch: 3,
        voted_for: None,
        leader_id: Some(1),
    };
    let mut node = RaftNode::new(config(2, &[1, 2, 3]), election, log_of(&[(1, 0), (2, 3)], 6), 0, 1);
    let (_, corr, _) = sent(&node.take_actions()).pop().expect("a fetch");
    let diverging = RaftResponse::Fetch(FetchResponse {
        error: ErrorCode::None,
        epoch: 3,
        leader_id: Some(1),
        high_watermark: 0,
        log_start_offset: 0,
        diverging_epoch: Some(DivergingEpoch {
            epoch: 1,
            end_offset: 3,
        }),
        snapshot_id: None,
        batches: vec![],
    });
    node.handle_response(timeout - 1, 1, corr, diverging);
    assert!(node.take_actions().contains(&Action::Truncate { end_offset: 3 }));
    cases.push(("a diverging epoch", node, timeout - 1));

    let mut node = follower_of_2_in_epoch_5();
    let (_, corr, _) = sent(&node.take_actions()).pop().expect("a fetch");
    node.handle_response(timeout - 1, 2, corr, snapshot_needed());
    assert!(matches!(next_request(&mut node).1, RaftRequest::FetchSnapshot(_)));
    cases.push(("a snapshot to fetch", node, timeout - 1));

    // Told to fetch the snapshot at 1; the first chunk comes at `timeout`.
    let mut node = follower_behind_the_log_start();
    let (corr, _) = next_request(&mut node);
    node.handle_response(timeout, 2, corr, chunk(0, 10, 25));
    cases.push(("a snapshot chunk", node, timeout));

    for (what, mut node, at) in cases {
        node.take_actions();
        node.tick(at + timeout - 1);
        assert_eq!(node.role().role, RoleKind::Follower, "{what}");
        node.tick(at + timeout);
        assert_eq!(
            node.role().role,
            RoleKind::Prospective,
            "{what}: the timeout runs from the last success"
        );
    }
}

#[test]
fn a_failed_install_slower_than_the_fetch_timeout_leaves_a_follower_that_fetches_again() {
    let (mut node, id) = follower_installing();
    let done = 2 + node.config().fetch_timeout_ms + 500;
    node.on_snapshot_install_failed(done, id).unwrap();
    assert_eq!(node.role().role, RoleKind::Follower);
    node.tick(done + 1_000);
    let (_, request) = next_request(&mut node);
    assert!(
        matches!(request, RaftRequest::Fetch(ref f) if f.fetch_offset == 10),
        "{request:?}"
    );
}

#[test]
fn an_install_nobody_asked_for_is_ignored() {
    let stray = SnapshotId {
        end_offset: 200,
        epoch: 4,
    };
    // A leader never loads a snapshot.
    let (mut leader, _) = leader_with_snapshot();
    let log = leader.log().clone();
    assert!(leader.on_snapshot_installed(1, stray).is_err());
    assert_eq!(leader.role().role, RoleKind::Leader);
    assert_eq!(leader.log(), &log);
    assert_eq!(leader.latest_snapshot(), Some(SNAPSHOT));
    assert!(leader.take_actions().is_empty());

    // A follower still receiving the snapshot, or installing another one.
    let mut receiving = follower_behind_the_log_start();
    receiving.take_actions();
    assert!(receiving.on_snapshot_installed(2, stray).is_err());
    assert_eq!((receiving.log().start_offset(), receiving.log().end_offset()), (0, 10));
    assert_eq!(receiving.latest_snapshot(), None);
    assert!(!receiving
        .take_actions()
        .iter()
        .any(|a| matches!(a, Action::HighWatermark(_))));
    let (mut installing, id) = follower_installing();
    let other = SnapshotId {
        end_offset: 300,
        epoch: 4,
    };
    assert!(installing.on_snapshot_installed(3, other).is_err());
    assert!(installing.on_snapshot_install_failed(3, other).is_err());
    assert_eq!(installing.log().end_offset(), 10);
    assert_eq!(installing.latest_snapshot(), None);
    // The install it waits for still completes.
    assert_eq!(installing.on_snapshot_installed(4, id), Ok(()));
    assert_eq!(installing.log().start_offset(), 200);
    assert_eq!(installing.latest_snapshot(), Some(id));
}

/// An observer whose flush stalls past the fetch timeout goes back to
/// Unattached; its leader-discovery fetch names its log end, so it too
/// waits until that end is durable.
#[test]
fn an_observer_never_fetches_past_its_flushed_end() {
    let mut node = start(
        9,
        &[1, 2, 3],
        ElectionState {
            epoch: 1,
            voted_for: None,
            leader_id: Some(1),
        },
    );
    let corr = sent(&node.take_actions())[0].1;
    let batch = Batch::new(0, 1, &[Record::NoOp, Record::NoOp]);
    node.handle_response(5, 1, corr, data_response(1, 0, vec![batch]));
    assert!(node.take_actions().contains(&Action::Flush));
    // The disk stalls past the fetch timeout.
    node.tick(5 + FETCH_T);
    assert_eq!(node.role().role, RoleKind::Unattached);
    let fetches = |actions: &[Action]| -> Vec<Offset> {
        sent(actions)
            .into_iter()
            .filter_map(|(_, _, r)| match r {
                RaftRequest::Fetch(f) => Some(f.fetch_offset),
                _ => None,
            })
            .collect()
    };
    assert_eq!(
        fetches(&node.take_actions()),
        Vec::<Offset>::new(),
        "nothing is flushed yet"
    );
    assert_eq!(node.next_deadline_ms(), u64::MAX, "it waits for the flush, not a timer");
    node.on_flushed(6 + FETCH_T, 2);
    assert_eq!(
        fetches(&node.take_actions()),
        vec![2],
        "then it asks from its durable end"
    );
}

/// No epoch follows `Epoch::MAX`: a node taught it by a peer, or starting
/// with it, never panics or wraps the epoch; it just cannot campaign.
#[test]
fn a_peer_sending_the_largest_epoch_cannot_panic_the_node() {
    let mut node = start(1, &[1, 2, 3], ElectionState::default());
    node.take_actions();
    let begin = begin_req(Epoch::MAX, 2);
    node.handle_request(1, 2, 1, begin);
    assert_eq!(persisted(&node.take_actions())[0].epoch, Epoch::MAX);
    assert_eq!(node.role().role, RoleKind::Follower);
    // The leader goes silent: no campaign, no election timer left to spin on.
    node.tick(10 * FETCH_T);
    let actions = node.take_actions();
    assert!(persisted(&actions).is_empty(), "{actions:?}");
    assert!(!sent(&actions).iter().any(|(_, _, r)| matches!(r, RaftRequest::Vote(_))));
    assert_eq!(node.role().role, RoleKind::Unattached);
    assert_eq!(node.role().epoch, Epoch::MAX);
    assert_eq!(node.next_deadline_ms(), u64::MAX);
    node.tick(100 * FETCH_T);
    assert!(node.take_actions().is_empty());
}

#[test]
fn a_single_voter_at_the_largest_epoch_starts_without_panicking() {
    let mut node = start(
        1,
        &[1],
        ElectionState {
            epoch: Epoch::MAX,
            voted_for: Some(1),
            leader_id: Some(1),
        },
    );
    assert_eq!(
        (node.role().role, node.role().epoch),
        (RoleKind::Unattached, Epoch::MAX)
    );
    node.take_actions();
    node.tick(10 * FETCH_T);
    assert!(node.take_actions().is_empty());
}

/// A fetch answer naming a snapshot of a later epoch than the leader's (or
/// ending below the high watermark) is refused: installing it would start
/// the log at an epoch the node's next leadership could not append to.
#[test]
fn a_snapshot_of_a_later_epoch_than_the_leaders_is_refused() {
    let mut node = follower_of_2_in_epoch_5();
    let later = SnapshotId {
        end_offset: 200,
        epoch: 50,
    };
    let (to, corr, _) = sent(&node.take_actions()).pop().expect("a fetch");
    node.handle_response(1, to, corr, leader_2_answer(300, 200, Some(later)));
    // Refused: the next request is a Fetch again (after the backoff), never
    // a FetchSnapshot.
    node.tick(1 + 1000);
    let next = sent(&node.take_actions());
    assert!(
        next.iter().all(|(_, _, r)| matches!(r, RaftRequest::Fetch(_))) && !next.is_empty(),
        "{next:?}"
    );
    // The same id in the leader's epoch is fetched.
    let ours = SnapshotId {
        end_offset: 200,
        epoch: 5,
    };
    node.handle_response(2, next[0].0, next[0].1, leader_2_answer(300, 200, Some(ours)));
    node.tick(3);
    assert!(
        sent(&node.take_actions())
            .iter()
            .any(|(_, _, r)| matches!(r, RaftRequest::FetchSnapshot(f) if f.snapshot_id == ours)),
        "the leader's own snapshot is fetched"
    );
}

/// A follower of leader 2 in epoch 5 whose log [0, 10) is all committed,
/// after the leader's next answer names its snapshot `end_offset`@1 (the
/// leader's log starting at `log_start`).
fn told_of_a_snapshot_at_hw_10(end_offset: Offset, log_start: Offset) -> (RaftNode, SnapshotId) {
    let mut node = follower_of_2_in_epoch_5();
    let (to, corr, _) = sent(&node.take_actions()).pop().expect("a fetch");
    node.handle_response(1, to, corr, leader_2_answer(10, 0, None));
    assert_eq!(node.high_watermark(), 10);
    node.tick(2);
    let (to, corr, _) = sent(&node.take_actions()).pop().expect("the next fetch");
    let id = SnapshotId { end_offset, epoch: 1 };
    node.handle_response(3, to, corr, leader_2_answer(10, log_start, Some(id)));
    (node, id)
}

/// Nor is one ending below the follower's high watermark: installing it
/// would drop committed records from the log.
#[test]
fn a_snapshot_ending_below_the_high_watermark_is_refused() {
    let (mut node, _) = told_of_a_snapshot_at_hw_10(5, 0);
    node.tick(3 + 1000);
    let next = sent(&node.take_actions());
    assert!(
        !next.is_empty() && next.iter().all(|(_, _, r)| matches!(r, RaftRequest::Fetch(_))),
        "{next:?}"
    );
}

/// The boundary of the rule above: a snapshot that ends exactly at the high
/// watermark holds every committed record, and is fetched.
#[test]
fn a_snapshot_ending_at_the_high_watermark_is_fetched() {
    let (mut node, at) = told_of_a_snapshot_at_hw_10(10, 10);
    let next = sent(&node.take_actions());
    assert!(
        matches!(next.as_slice(), [(2, _, RaftRequest::FetchSnapshot(r))] if r.snapshot_id == at),
        "{next:?}"
    );
}

/// A restarted follower's high watermark starts at its log start and is
/// learnt from the leader, but its store knows what was committed before
/// (the high watermark hint). Until the leader tells it, a divergence that
/// would cut below that, or a snapshot ending below it, is refused as one
/// below the high watermark is; the store would refuse the cut or the
/// reset and stop the node, and after a snapshot it could not start again.
#[test]
fn a_restarted_follower_refuses_to_give_up_what_its_store_knew_committed() {
    // Epoch 1 [0,3), epoch 2 [3,6); the store knew [0,5) committed.
    let restarted = |committed: Option<Offset>| {
        let election = ElectionState {
            epoch: 5,
            voted_for: None,
            leader_id: Some(2),
        };
        let mut node = RaftNode::new(config(1, &[1, 2, 3]), election, log_of(&[(1, 0), (2, 3)], 6), 0, 7);
        if let Some(committed) = committed {
            node.restore_committed(committed);
        }
        assert_eq!(node.high_watermark(), 0, "learnt from the leader, as in KRaft");
        let (to, corr, _) = sent(&node.take_actions()).pop().expect("a fetch");
        (node, to, corr)
    };
    let diverging = |end_offset| {
        RaftResponse::Fetch(FetchResponse {
            diverging_epoch: Some(DivergingEpoch { epoch: 1, end_offset }),
            ..match leader_2_answer(0, 0, None) {
                RaftResponse::Fetch(f) => f,
                _ => unreachable!(),
            }
        })
    };
    let truncated = |node: &mut RaftNode| node.take_actions().iter().any(|a| matches!(a, Action::Truncate { .. }));
    let snapshot_fetched = |node: &mut RaftNode| {
        node.tick(1_000);
        sent(&node.take_actions())
            .iter()
            .any(|(_, _, r)| matches!(r, RaftRequest::FetchSnapshot(_)))
    };
    let snapshot_at = |end_offset| leader_2_answer(0, 0, Some(SnapshotId { end_offset, epoch: 2 }));

    // Without the store's word, both are taken (the control).
    let (mut node, to, corr) = restarted(None);
    node.handle_response(1, to, corr, diverging(3));
    assert!(truncated(&mut node), "cut at the end of epoch 1");
    let (mut node, to, corr) = restarted(None);
    node.handle_response(1, to, corr, snapshot_at(4));
    assert!(snapshot_fetched(&mut node));

    // With it, both are refused, and what does not go below it is taken.
    let (mut node, to, corr) = restarted(Some(5));
    node.handle_response(1, to, corr, diverging(3));
    assert!(!truncated(&mut node), "a cut below what was committed");
    assert_eq!(node.log().end_offset(), 6);
    let (mut node, to, corr) = restarted(Some(5));
    node.handle_response(1, to, corr, snapshot_at(4));
    assert!(
        !snapshot_fetched(&mut node),
        "a snapshot ending below what was committed"
    );
    let (mut node, to, corr) = restarted(Some(5));
    node.handle_response(1, to, corr, snapshot_at(6));
    assert!(snapshot_fetched(&mut node));
    let (mut node, to, corr) = restarted(Some(3));
    node.handle_response(1, to, corr, diverging(3));
    assert!(truncated(&mut node), "a cut at what was committed");
}

// ---------------------------------------------------------------- rules pinned by the mutation sweep

/// After EndQuorumEpoch the leader is no longer live for pre-votes: the
/// preferred successor's pre-vote must win at once among followers that
/// fetched from the leader a moment ago (else the hand-over waits out a
/// fetch timeout).
#[test]
fn a_follower_whose_leader_resigned_grants_pre_votes() {
    let (mut node, corr) = follower_with_fetch();
    node.handle_response(5, 1, corr, data_response(1, 0, vec![]));
    node.take_actions();
    node.handle_request(6, 3, 1, vote_req(2, 3, 0, 0, true));
    assert!(
        !granted(&node.take_actions()),
        "the leader fetched from 1 ms ago is live"
    );
    node.handle_request(7, 1, 2, end_req(1, 1, vec![3, 2]));
    node.take_actions();
    assert_eq!(node.role().role, RoleKind::Follower);
    node.handle_request(8, 3, 3, vote_req(2, 3, 0, 0, true));
    assert!(
        granted(&node.take_actions()),
        "a leader that announced its resignation is no longer live"
    );
}

/// `voted_for` is a vote in the persisted epoch: moving to a later epoch
/// (here through BeginQuorumEpoch) leaves no vote behind.
#[test]
fn a_vote_is_not_carried_into_a_later_epoch() {
    let mut node = start(
        1,
        &[1, 2, 3],
        ElectionState {
            epoch: 1,
            voted_for: Some(2),
            leader_id: None,
        },
    );
    node.take_actions();
    node.handle_request(1, 3, 1, begin_req(2, 3));
    let actions = node.take_actions();
    assert_eq!(
        persisted(&actions),
        vec![ElectionState {
            epoch: 2,
            voted_for: None,
            leader_id: Some(3)
        }]
    );
    assert_eq!(node.role().voted_for, None);
}

/// Two leaders in one epoch would break election safety: a follower asked
/// by another node to follow it in its leader's epoch refuses and keeps
/// its leader.
#[test]
fn begin_quorum_epoch_from_a_second_leader_of_the_same_epoch_is_refused() {
    let mut node = start(
        1,
        &[1, 2, 3],
        ElectionState {
            epoch: 5,
            voted_for: None,
            leader_id: Some(2),
        },
    );
    node.take_actions();
    node.handle_request(1, 3, 1, begin_req(5, 3));
    let actions = node.take_actions();
    match responses(&actions).last() {
        Some(RaftResponse::BeginQuorumEpoch(r)) => {
            assert_eq!((r.error, r.epoch, r.leader_id), (ErrorCode::InvalidRequest, 5, Some(2)))
        }
        other => panic!("{other:?}"),
    }
    assert!(persisted(&actions).is_empty());
    assert_eq!((node.role().role, node.role().leader_id), (RoleKind::Follower, Some(2)));
}

/// A voter the resigning leader did not name as a successor waits the
/// longest backoff, leaving the field to the successors (KIP-595).
#[test]
fn end_quorum_epoch_makes_a_voter_not_named_wait_the_longest_backoff() {
    let mut node = start(
        2,
        &[1, 2, 3],
        ElectionState {
            epoch: 2,
            voted_for: None,
            leader_id: Some(1),
        },
    );
    node.take_actions();
    node.handle_request(100, 1, 1, end_req(2, 1, vec![3]));
    node.tick(100 + 1000 - 1);
    assert_eq!(node.role().role, RoleKind::Follower, "not a successor: waits 1000 ms");
    node.tick(100 + 1000);
    assert_eq!(node.role().role, RoleKind::Prospective);
}

/// Only a voter can lead: a response naming a node outside the voter set
/// as leader of our epoch is not followed.
#[test]
fn a_response_naming_a_non_voter_leader_is_not_followed() {
    let mut node = start(
        1,
        &[1, 2, 3],
        ElectionState {
            epoch: 3,
            voted_for: None,
            leader_id: None,
        },
    );
    node.tick(2 * T + 1);
    let pre_votes = sent(&node.take_actions());
    assert_eq!(node.role().role, RoleKind::Prospective);
    let (to, corr, _) = pre_votes[0].clone();
    node.handle_response(
        2 * T + 2,
        to,
        corr,
        RaftResponse::Vote(VoteResponse {
            error: ErrorCode::None,
            epoch: 3,
            leader_id: Some(9),
            vote_granted: false,
            pre_vote: true,
        }),
    );
    assert_eq!(node.role().role, RoleKind::Prospective);
    assert_eq!(node.role().leader_id, None);
    assert!(persisted(&node.take_actions()).is_empty());
}

/// The follower's log epochs never go down: a batch of an older epoch than
/// its last one is refused, not written (nor does it reach the epoch cache).
#[test]
fn a_batch_of_an_older_epoch_than_the_log_end_is_not_written() {
    let log = log_of(&[(1, 0), (2, 2)], 3);
    let mut node = RaftNode::new(
        config(2, &[1, 2, 3]),
        ElectionState {
            epoch: 2,
            voted_for: None,
            leader_id: Some(1),
        },
        log,
        0,
        1,
    );
    let fetch = sent(&node.take_actions());
    node.handle_response(
        5,
        1,
        fetch[0].1,
        data_response(2, 0, vec![Batch::new(3, 1, &[Record::NoOp])]),
    );
    assert!(!node.take_actions().iter().any(|a| matches!(a, Action::AppendBatch(_))));
    assert_eq!((node.log().end_offset(), node.log().last_epoch()), (3, 2));
}

/// The high watermark never moves backwards on a follower, not even when a
/// new leader, which learns the high watermark only once its own epoch
/// commits, reports a lower one.
#[test]
fn a_follower_high_watermark_never_moves_back() {
    let (mut node, corr) = follower_with_fetch();
    node.handle_response(
        5,
        1,
        corr,
        data_response(
            1,
            3,
            vec![Batch::new(0, 1, &[Record::NoOp, Record::NoOp, Record::NoOp])],
        ),
    );
    assert_eq!(node.high_watermark(), 3);
    node.on_flushed(6, 3);
    let fetch = sent(&node.take_actions());
    node.handle_response(7, 1, fetch[0].1, data_response(1, 1, vec![]));
    assert_eq!(node.high_watermark(), 3);
    assert!(!node
        .take_actions()
        .iter()
        .any(|a| matches!(a, Action::HighWatermark(_))));
}

/// A voter fetching a snapshot (a long transfer) is alive for
/// check-quorum, as in Kafka: the leader does not resign meanwhile.
#[test]
fn snapshot_fetches_keep_the_leader_in_check_quorum() {
    let (mut node, mut now) = elect_leader();
    node.on_flushed(now, 1);
    node.handle_request(now, 2, 1, fetch_req(2, 1, 1, 1, 0));
    assert_eq!(node.high_watermark(), 1);
    let id = SnapshotId {
        end_offset: 1,
        epoch: 1,
    };
    node.on_snapshot_created(now, id);
    for i in 0..5 {
        now += FETCH_T;
        node.handle_request(
            now,
            3,
            100 + i,
            RaftRequest::FetchSnapshot(FetchSnapshotRequest {
                replica_id: 3,
                current_epoch: 1,
                snapshot_id: id,
                position: 0,
                max_bytes: 4096,
            }),
        );
        node.tick(now);
        assert_eq!(node.role().role, RoleKind::Leader, "round {i}");
    }
}

/// A fetch must come from the replica it names: else one node could
/// acknowledge offsets for another voter and commit on its behalf.
#[test]
fn a_fetch_naming_another_replica_is_refused() {
    let (mut node, now) = elect_leader();
    node.on_flushed(now, 1);
    node.take_actions();
    node.handle_request(now, 3, 1, fetch_req(2, 1, 1, 1, 0));
    let response = fetch_response(&node.take_actions());
    assert_eq!(response.error, ErrorCode::InvalidRequest);
    assert_eq!(node.high_watermark(), 0, "no acknowledgement was counted");
}

#[test]
fn a_snapshot_fetch_naming_another_replica_is_refused() {
    let (mut node, epoch) = leader_with_snapshot();
    node.handle_request(
        1,
        8,
        1,
        RaftRequest::FetchSnapshot(FetchSnapshotRequest {
            replica_id: 7,
            current_epoch: epoch,
            snapshot_id: SNAPSHOT,
            position: 0,
            max_bytes: 4096,
        }),
    );
    match responses(&node.take_actions()).last() {
        Some(RaftResponse::FetchSnapshot(r)) => assert_eq!(r.error, ErrorCode::InvalidRequest),
        other => panic!("{other:?}"),
    }
}

/// Consecutive lost candidacies back off longer and longer (Kafka's
/// binary exponential backoff): the first waits the base, and by the third
/// some seeds wait more.
#[test]
fn election_backoff_grows_with_consecutive_lost_candidacies() {
    let mut longer = false;
    for seed in 0..16 {
        let mut node = RaftNode::new(
            config(1, &[1, 2, 3]),
            ElectionState::default(),
            LogView::empty(),
            0,
            seed,
        );
        let mut now = 0;
        for lost in 1..=3 {
            // Win the pre-vote, then lose the vote to a majority of refusals.
            now = node.next_deadline_ms().max(now);
            node.tick(now);
            assert_eq!(node.role().role, RoleKind::Prospective, "seed {seed}, candidacy {lost}");
            let epoch = node.role().epoch;
            for (to, corr, _) in sent(&node.take_actions()) {
                node.handle_response(
                    now,
                    to,
                    corr,
                    RaftResponse::Vote(VoteResponse {
                        error: ErrorCode::None,
                        epoch,
                        leader_id: None,
                        vote_granted: true,
                        pre_vote: true,
                    }),
                );
                if node.role().role == RoleKind::Candidate {
                    break;
                }
            }
            assert_eq!(node.role().role, RoleKind::Candidate);
            let epoch = node.role().epoch;
            for (to, corr, _) in sent(&node.take_actions()) {
                node.handle_response(
                    now,
                    to,
                    corr,
                    RaftResponse::Vote(VoteResponse {
                        error: ErrorCode::None,
                        epoch,
                        leader_id: None,
                        vote_granted: false,
                        pre_vote: false,
                    }),
                );
            }
            let backoff = node.next_deadline_ms() - now;
            if lost == 1 {
                assert_eq!(backoff, 100, "seed {seed}: the first backoff is the base");
            } else if backoff > 100 {
                longer = true;
            }
        }
    }
    assert!(longer, "no seed ever backed off longer than the base");
}

/// Election timeouts are randomized in [T, 2T] so that voters do not all
/// campaign at once.
#[test]
fn election_timeouts_are_randomized() {
    let deadlines: std::collections::BTreeSet<u64> = (0..16)
        .map(|seed| {
            RaftNode::new(
                config(1, &[1, 2, 3]),
                ElectionState::default(),
                LogView::empty(),
                0,
                seed,
            )
            .next_deadline_ms()
        })
        .collect();
    assert!(deadlines.iter().all(|d| (T..=2 * T).contains(d)), "{deadlines:?}");
    assert!(deadlines.len() > 1, "{deadlines:?}");
}

/// Observers never count toward the high watermark, even when the
/// leader's own flush (not a fetch) triggers the computation.
#[test]
fn an_observer_never_completes_a_majority_with_the_leader() {
    let (mut node, now) = elect_leader();
    node.take_actions();
    // The LeaderChange record [0, 1) is being flushed; observer 9 has it.
    node.handle_request(now, 9, 1, fetch_req(9, 1, 1, 1, 0));
    node.on_flushed(now, 1);
    assert_eq!(node.high_watermark(), 0, "the leader and an observer are no majority");
    node.handle_request(now, 2, 2, fetch_req(2, 1, 1, 1, 0));
    assert_eq!(node.high_watermark(), 1);
}

/// Check-quorum needs other voters: a single voter leads for ever.
#[test]
fn a_single_voter_leader_never_fails_check_quorum() {
    let mut node = start(1, &[1], ElectionState::default());
    node.on_flushed(1, 1);
    node.tick(10 * FETCH_T);
    assert_eq!((node.role().role, node.role().epoch), (RoleKind::Leader, 1));
}

/// Compaction up to exactly where a parked fetch waits leaves the fetch
/// parked: the replica is at the log start, not below it, and needs no
/// snapshot.
#[test]
fn a_parked_fetch_at_the_new_log_start_is_not_sent_to_the_snapshot() {
    let (mut node, epoch) = leader_with_snapshot();
    let end = node.log().end_offset();
    node.on_flushed(0, end);
    node.take_actions();
    // The first fetch, behind on the high watermark, is answered when the
    // second replaces it; the second stays parked (for the linger).
    node.handle_request(1, 7, 1, fetch_req(7, epoch, end, epoch, 500));
    node.handle_request(1, 7, 2, fetch_req(7, epoch, end, epoch, 500));
    let actions = node.take_actions();
    assert_eq!(responses(&actions).len(), 1, "{actions:?}");
    node.on_log_start_advanced(2, end, epoch);
    assert!(responses(&node.take_actions()).is_empty(), "still parked");
}

/// A candidate re-asking for a vote (its request timed out) gets it again,
/// but does not push the voter's own election timer further each time.
#[test]
fn granting_the_same_vote_again_keeps_the_election_timer() {
    let mut node = start(1, &[1, 2, 3], ElectionState::default());
    node.handle_request(5, 2, 1, vote_req(1, 2, 0, 0, false));
    assert!(granted(&node.take_actions()));
    let deadline = node.next_deadline_ms();
    node.handle_request(deadline - 1, 2, 2, vote_req(1, 2, 0, 0, false));
    assert!(granted(&node.take_actions()));
    assert_eq!(node.next_deadline_ms(), deadline);
}

/// A candidate told by a voter that another candidate won its epoch
/// follows that leader at once.
#[test]
fn a_candidate_follows_a_leader_of_its_epoch_named_in_a_vote_response() {
    let mut node = start(
        1,
        &[1, 2, 3],
        ElectionState {
            epoch: 4,
            voted_for: Some(1),
            leader_id: None,
        },
    );
    assert_eq!(node.role().role, RoleKind::Candidate);
    let votes = sent(&node.take_actions());
    let (to, corr, _) = votes[0].clone();
    node.handle_response(
        1,
        to,
        corr,
        RaftResponse::Vote(VoteResponse {
            error: ErrorCode::None,
            epoch: 4,
            leader_id: Some(3),
            vote_granted: false,
            pre_vote: false,
        }),
    );
    assert_eq!(
        (node.role().role, node.role().epoch, node.role().leader_id),
        (RoleKind::Follower, 4, Some(3))
    );
}

/// EndQuorumEpoch reaches an unattached voter too (here one that never
/// heard of the resigning leader's epoch): the first successor campaigns at
/// once instead of waiting out its election timeout.
#[test]
fn end_quorum_epoch_makes_an_unattached_successor_campaign_at_once() {
    let mut node = start(
        2,
        &[1, 2, 3],
        ElectionState {
            epoch: 2,
            voted_for: None,
            leader_id: None,
        },
    );
    node.take_actions();
    node.handle_request(100, 1, 1, end_req(3, 1, vec![2, 3]));
    assert_eq!((node.role().role, node.role().epoch), (RoleKind::Prospective, 3));
}

/// Admission (`raft::admission`): once `MAX_UNFLUSHED_BYTES` of appends wait
/// for the disk, a leader refuses proposals, writing nothing; the flush
/// that makes them durable lets proposals in again.
#[test]
fn a_leader_refuses_proposals_while_its_disk_is_behind_and_takes_them_again_once_flushed() {
    let mut node = start(1, &[1], ElectionState::default());
    node.take_actions();
    let record = Record::Data(vec![7; 1 << 20]);
    let mut accepted = 0;
    let refused_at = loop {
        match node.propose(0, vec![record.clone()]) {
            Ok(_) => accepted += 1,
            Err(ProposeError::DiskBehind { bytes }) => break bytes,
            Err(e) => panic!("refused for another reason: {e}"),
        }
        assert!(accepted <= 64, "never refused");
    };
    assert!(refused_at >= admission::MAX_UNFLUSHED_BYTES, "{refused_at}");
    // The flush in flight only covers what it was asked for; the next one
    // covers the rest.
    node.on_flushed(0, node.log().end_offset());
    node.take_actions();
    node.on_flushed(0, node.log().end_offset());
    node.take_actions();
    assert!(node.propose(0, vec![record]).is_ok(), "flushed, so admitted again");
}

/// A node that does not lead routes a client's append to the leader it
/// knows, refusing by the leader's own rules what the leader would refuse.
#[test]
fn a_follower_routes_appends_to_its_leader_and_refuses_what_the_leader_would() {
    let mut node = start(2, &[1, 2, 3], ElectionState::default());
    assert_eq!(
        node.route_append(&[b"a".to_vec()]),
        AppendRoute::Refuse(ProposeError::NotLeader {
            leader_id: None,
            epoch: 0
        }),
        "no leader known"
    );
    node.handle_request(0, 1, 1, begin_req(1, 1));
    assert_eq!(node.route_append(&[b"a".to_vec()]), AppendRoute::Forward(1));
    assert_eq!(node.route_append(&[]), AppendRoute::Refuse(ProposeError::Empty));
    let limit = node.config().max_batch_bytes;
    let many_short: Vec<Vec<u8>> = vec![Vec::new(); limit / Record::data_encoded_len(0) + 1];
    assert!(matches!(
        node.route_append(&many_short),
        AppendRoute::Refuse(ProposeError::TooLarge { .. })
    ));
    let (leader, _) = elect_leader();
    assert_eq!(leader.route_append(&[b"a".to_vec()]), AppendRoute::Propose);
}

/// Admission: proposals waiting for their commit count only while their
/// leadership lasts. A leader whose quorum stopped answering refuses
/// appends at `MAX_AWAITING_COMMIT`; once it follows a new leader their
/// outcomes are unknown and no longer count, so appends go to that leader.
#[test]
fn proposals_waiting_to_commit_stop_counting_when_leadership_ends() {
    let (mut node, now) = elect_leader();
    let epoch = node.role().epoch;
    let refused = loop {
        match node.propose(now, vec![Record::Data(vec![1])]) {
            Ok(_) => continue,
            Err(e) => break e,
        }
    };
    assert_eq!(
        refused,
        ProposeError::CommitBehind {
            appends: admission::MAX_AWAITING_COMMIT
        }
    );
    node.take_actions();
    node.handle_request(now, 2, 1, begin_req(epoch + 1, 2));
    assert_eq!(node.role().role, RoleKind::Follower);
    assert_eq!(node.route_append(&[b"a".to_vec()]), AppendRoute::Forward(2));
}

/// One clock for one request: every `Send` carries the engine's own
/// timeout for it, which the transport uses, so a fetch that may be parked
/// for `fetch_max_wait_ms` is not timed out by the transport first.
#[test]
fn every_send_carries_the_engines_own_timeout_for_it() {
    let mut config = config(2, &[1, 2, 3]);
    config.request_timeout_ms = 600;
    config.fetch_max_wait_ms = 500;
    let mut node = RaftNode::new(config, ElectionState::default(), LogView::empty(), 0, 7);
    node.take_actions();
    node.handle_request(0, 1, 1, begin_req(1, 1));
    let actions = node.take_actions();
    let fetch_timeout = actions.iter().find_map(|a| match a {
        Action::Send {
            request: RaftRequest::Fetch(_),
            timeout_ms,
            ..
        } => Some(*timeout_ms),
        _ => None,
    });
    assert_eq!(fetch_timeout, Some(800), "max wait plus half a request timeout");
    // A vote request gets the plain request timeout.
    let mut candidate = RaftNode::new(
        {
            let mut c = super::tests::config(1, &[1, 2, 3]);
            c.request_timeout_ms = 600;
            c
        },
        ElectionState::default(),
        LogView::empty(),
        0,
        7,
    );
    candidate.take_actions();
    candidate.tick(3 * T);
    let vote_timeouts: Vec<u64> = candidate
        .take_actions()
        .iter()
        .filter_map(|a| match a {
            Action::Send { timeout_ms, .. } => Some(*timeout_ms),
            _ => None,
        })
        .collect();
    assert!(!vote_timeouts.is_empty(), "a pre-vote was sent");
    assert!(vote_timeouts.iter().all(|t| *t == 600), "{vote_timeouts:?}");
}

/// A log holding an epoch its election state never reached (the state was
/// lost): the node starts Unattached in the log's epoch with no vote, and
/// makes that durable first, so it never votes in an epoch it may already
/// have voted in.
#[test]
fn a_log_ahead_of_the_election_state_starts_the_node_unattached_in_the_logs_epoch() {
    let election = ElectionState {
        epoch: 1,
        voted_for: Some(2),
        leader_id: None,
    };
    let mut node = RaftNode::new(config(1, &[1, 2, 3]), election, log_of(&[(1, 0), (3, 5)], 10), 0, 7);
    let actions = node.take_actions();
    assert!(
        matches!(actions.first(), Some(Action::PersistElection(s)) if *s == ElectionState::unattached(3)),
        "first of all, the reconciled state is made durable: {actions:?}"
    );
    let role = node.role();
    assert_eq!((role.role, role.epoch, role.voted_for), (RoleKind::Unattached, 3, None));
    node.handle_request(1, 3, 1, vote_req(2, 3, 3, 10, false));
    let actions = node.take_actions();
    assert!(!granted(&actions), "no vote in an epoch below the log's");
    assert!(persisted(&actions).is_empty());
}

/// A Vote naming this node as candidate (a peer claiming its id) is
/// refused and changes nothing.
#[test]
fn a_vote_naming_the_receiver_as_candidate_is_refused() {
    let mut node = start(1, &[1, 2, 3], ElectionState::unattached(1));
    node.take_actions();
    node.handle_request(1, 1, 1, vote_req(2, 1, 0, 0, false));
    let actions = node.take_actions();
    match responses(&actions).last() {
        Some(RaftResponse::Vote(v)) => assert_eq!((v.error, v.vote_granted), (ErrorCode::InvalidRequest, false)),
        other => panic!("{other:?}"),
    }
    assert!(persisted(&actions).is_empty());
    assert_eq!((node.role().epoch, node.role().voted_for), (1, None));
}

/// Kafka's hasConsistentLeader: a follower that timed out (Prospective)
/// keeps the leader it recorded for its epoch, and refuses a
/// BeginQuorumEpoch of the same epoch from another node; its own leader's
/// is taken.
#[test]
fn begin_quorum_epoch_from_another_leader_than_the_recorded_one_is_refused() {
    let mut node = start(
        1,
        &[1, 2, 3],
        ElectionState {
            epoch: 5,
            voted_for: None,
            leader_id: Some(2),
        },
    );
    node.take_actions();
    node.tick(FETCH_T + 1);
    assert_eq!(node.role().role, RoleKind::Prospective);
    node.take_actions();
    node.handle_request(FETCH_T + 2, 3, 1, begin_req(5, 3));
    let actions = node.take_actions();
    match responses(&actions).last() {
        Some(RaftResponse::BeginQuorumEpoch(r)) => assert_eq!(r.error, ErrorCode::InvalidRequest),
        other => panic!("{other:?}"),
    }
    assert!(persisted(&actions).is_empty());
    assert_eq!(node.role().role, RoleKind::Prospective);
    node.handle_request(FETCH_T + 3, 2, 2, begin_req(5, 2));
    node.take_actions();
    assert_eq!((node.role().role, node.role().leader_id), (RoleKind::Follower, Some(2)));
}

/// A batch whose CRC matches but whose records do not decode (a damaged or
/// hostile leader) is refused before it is written, so it can never be
/// committed and fail later reads; the follower fetches again.
#[test]
fn a_fetched_batch_that_does_not_decode_is_never_written() {
    let (mut node, corr) = follower_with_fetch();
    let damaged = Batch::sealed(0, 1, 1, vec![0xff; 12]);
    assert!(damaged.verify(), "its CRC matches");
    node.handle_response(1, 1, corr, data_response(1, 1, vec![damaged]));
    let actions = node.take_actions();
    assert!(
        !actions.iter().any(|a| matches!(a, Action::AppendBatch(_))),
        "{actions:?}"
    );
    assert_eq!((node.log().end_offset(), node.high_watermark()), (0, 0));
    node.tick(1 + node.config().retry_backoff_ms.max(1));
    assert!(
        sent(&node.take_actions())
            .iter()
            .any(|(_, _, r)| matches!(r, RaftRequest::Fetch(f) if f.fetch_offset == 0)),
        "fetches the same offset again"
    );
}

/// A linearizable read's barrier: on a leader, the log's end, passed by a
/// NoOp written now when nothing waits to be written; nowhere else.
#[test]
fn a_read_barrier_is_the_leaders_log_end_and_a_noop_passes_it() {
    let (mut node, now) = elect_leader();
    node.take_actions();
    let end = node.log().end_offset();
    assert_eq!(node.read_barrier(now + 1), Some(end));
    let actions = node.take_actions();
    let appended: Vec<&Batch> = actions
        .iter()
        .filter_map(|a| match a {
            Action::AppendBatch(batch) => Some(batch),
            _ => None,
        })
        .collect();
    assert_eq!(appended.len(), 1, "{actions:?}");
    assert_eq!(appended[0].base_offset, end);
    assert_eq!(appended[0].records().unwrap(), vec![Record::NoOp]);
    let mut follower = start(2, &[1, 2, 3], ElectionState::unattached(1));
    assert_eq!(follower.read_barrier(1), None);
}
