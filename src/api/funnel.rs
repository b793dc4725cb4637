//! `POST /v1/append` requests of one HTTP thread, handed to the node
//! together.
//!
//! With worker threads (`listeners.http_workers` ≥ 1) every append crosses
//! from a worker to the node's actor thread and its answer crosses back.
//! One message each way per request cost the leader more in thread
//! wake-ups and context switches than in the quorum's own work
//! (BENCHMARKS.md, "What limits the figures"). A funnel lives on each
//! thread that serves the API (a worker, or the node's own thread): the
//! appends its connections decode in the same turn of the thread's event
//! loop go over as one [`NodeApi::append_each`] message, which the node
//! proposes as one batch; each request still gets its own outcome (its
//! own offsets, or its own error) as soon as it is known.
//!
//! A lone request goes alone: the funnel only waits for what is already
//! runnable on the thread (one yield), never for a timer.

use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;

use tokio::sync::oneshot;

use super::NodeApi;
use crate::node::{AppendError, Appended};
use crate::types::AppendReply;

/// Most appends handed over in one message; more wait for the next one.
/// As many as one forwarded request carries, so a follower forwards a
/// hand-over in one request.
const MAX_GROUPS: usize = crate::messages::MAX_APPEND_GROUPS;

pub(crate) struct AppendFunnel<N> {
    node: N,
    waiting: RefCell<Waiting>,
}

/// One request's records and where its outcome goes.
type Pending = (Vec<Vec<u8>>, AppendReply);

#[derive(Default)]
struct Waiting {
    appends: Vec<Pending>,
    /// A hand-over task is queued and has not taken `appends` yet.
    scheduled: bool,
}

impl<N: NodeApi> AppendFunnel<N> {
    pub(crate) fn new(node: N) -> Rc<AppendFunnel<N>> {
        Rc::new(AppendFunnel {
            node,
            waiting: RefCell::new(Waiting::default()),
        })
    }

    /// Like [`NodeApi::append`]: resolves at commit with this request's
    /// offsets, or with its error.
    pub(crate) fn append(
        self: &Rc<Self>,
        records: Vec<Vec<u8>>,
    ) -> impl Future<Output = Result<Appended, AppendError>> + 'static {
        let (reply, answer) = oneshot::channel();
        let mut waiting = self.waiting.borrow_mut();
        waiting.appends.push((records, reply));
        if !waiting.scheduled {
            waiting.scheduled = true;
            let funnel = self.clone();
            actix_rt::spawn(async move {
                // Let the connections that are already runnable on this
                // thread decode their requests first.
                tokio::task::yield_now().await;
                funnel.hand_over();
            });
        }
        async move {
            answer.await.unwrap_or_else(|_| {
                Err(AppendError::OutcomeUnknown(
                    "the node stopped before answering: the records may or may not have been appended".into(),
                ))
            })
        }
    }

    /// Everything waiting goes to the node, at most [`MAX_GROUPS`] appends
    /// per message.
    fn hand_over(&self) {
        let appends = {
            let mut waiting = self.waiting.borrow_mut();
            waiting.scheduled = false;
            std::mem::take(&mut waiting.appends)
        };
        let mut appends = appends.into_iter().peekable();
        while appends.peek().is_some() {
            let groups: Vec<Pending> = appends.by_ref().take(MAX_GROUPS).collect();
            tracing::trace!(groups = groups.len(), "appends handed over together");
            self.node.append_each(groups);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::node::{MetricsSnapshot, NodeError, QuorumStatus, RecordPage, SnapshotInfo};
    use crate::raft::Offset;

    /// Appends get consecutive offsets; records "bad" are rejected; every
    /// `append_each` call is recorded by its size.
    #[derive(Clone, Default)]
    struct Counter {
        calls: Arc<Mutex<Vec<usize>>>,
        next: Arc<Mutex<Offset>>,
    }

    impl Counter {
        fn outcome(&self, records: Vec<Vec<u8>>) -> Result<Appended, AppendError> {
            if records.iter().any(|r| r == b"bad") {
                return Err(AppendError::Rejected("bad".into()));
            }
            let mut next = self.next.lock().unwrap();
            let base_offset = *next;
            *next += records.len() as Offset;
            Ok(Appended {
                base_offset,
                last_offset: *next - 1,
                epoch: 1,
            })
        }
    }

    impl NodeApi for Counter {
        async fn append(&self, records: Vec<Vec<u8>>) -> Result<Appended, AppendError> {
            self.outcome(records)
        }
        fn append_each(&self, groups: Vec<Pending>) {
            self.calls.lock().unwrap().push(groups.len());
            for (records, reply) in groups {
                let _ = reply.send(self.outcome(records));
            }
        }
        async fn describe(&self) -> Result<QuorumStatus, NodeError> {
            unimplemented!()
        }
        async fn read_records(&self, _: Offset, _: usize) -> Result<RecordPage, NodeError> {
            unimplemented!()
        }
        async fn metrics(&self) -> Result<MetricsSnapshot, NodeError> {
            unimplemented!()
        }
        async fn create_snapshot(&self) -> Result<SnapshotInfo, NodeError> {
            unimplemented!()
        }
    }

    #[actix_rt::test]
    async fn appends_of_one_turn_go_together_and_each_gets_its_own_outcome() {
        let node = Counter::default();
        let funnel = AppendFunnel::new(node.clone());
        let a = funnel.append(vec![b"a".to_vec(), b"b".to_vec()]);
        let b = funnel.append(vec![b"bad".to_vec()]);
        let c = funnel.append(vec![b"c".to_vec()]);
        let (a, b, c) = futures::join!(a, b, c);
        assert_eq!(*node.calls.lock().unwrap(), vec![3]);
        assert_eq!(a.unwrap().base_offset, 0);
        assert!(matches!(b, Err(AppendError::Rejected(_))));
        let c = c.unwrap();
        assert_eq!((c.base_offset, c.last_offset), (2, 2));
        // A later request starts a new hand-over.
        let d = funnel.append(vec![b"d".to_vec()]).await.unwrap();
        assert_eq!(d.base_offset, 3);
        assert_eq!(*node.calls.lock().unwrap(), vec![3, 1]);
    }

    #[actix_rt::test]
    async fn a_crowd_is_split_into_hand_overs_of_at_most_max_groups() {
        let node = Counter::default();
        let funnel = AppendFunnel::new(node.clone());
        let all: Vec<_> = (0..MAX_GROUPS + 5)
            .map(|_| funnel.append(vec![b"x".to_vec()]))
            .collect();
        let outcomes = futures::future::join_all(all).await;
        let offsets: Vec<Offset> = outcomes.into_iter().map(|o| o.unwrap().base_offset).collect();
        assert_eq!(offsets, (0..(MAX_GROUPS + 5) as Offset).collect::<Vec<_>>());
        assert_eq!(*node.calls.lock().unwrap(), vec![MAX_GROUPS, 5]);
    }
}
