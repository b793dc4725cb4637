//! The queues in front of the storage thread and the chunk server: FIFO,
//! bounded as a stall detector, and how a thread waits on one.

use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError, TrySendError};

/// Most commands queued for the storage thread. A backlog this deep means the
/// disk has effectively stalled; the caller treats it as fatal (QuorumState)
/// or as an unavailable node (reads).
pub const MAX_QUEUED_COMMANDS: usize = 1 << 16;

/// A queue of at most [`MAX_QUEUED_COMMANDS`] items (see [`try_send_bounded`]),
/// which takes memory only for what it holds. A crossbeam `bounded` channel
/// allocates and initialises all its slots up front: the two of 65,536 slots
/// each (commands and snapshot chunk reads) were 8.5 MiB of every node's RSS,
/// idle or not.
pub(crate) fn command_queue<T>() -> (Sender<T>, Receiver<T>) {
    crossbeam_channel::unbounded()
}

/// Sends `item` unless [`MAX_QUEUED_COMMANDS`] are queued already. Two
/// senders may both pass the check: the bound is a stall detector, not an
/// exact capacity.
pub(crate) fn try_send_bounded<T>(tx: &Sender<T>, item: T) -> Result<(), TrySendError<T>> {
    if tx.len() >= MAX_QUEUED_COMMANDS {
        return Err(TrySendError::Full(item));
    }
    tx.try_send(item)
}

/// The storage thread's next command, waiting at most `timeout` (without
/// one, until a command comes or every handle is gone).
///
/// An empty queue parks the thread at once; every push unparks it
/// (`LogAppender`'s waker). crossbeam's own `recv` first spins and then calls
/// `sched_yield` up to four times before it parks, and on two busy vCPUs
/// a yield could keep the thread off the CPU for 1-2 ms while a command
/// pushed meanwhile, finding no parked receiver to wake, waited for it
/// (traced at C=256: BENCHMARKS.md, session of 2026-12-06, sixth).
pub(crate) fn next_command<T>(rx: &Receiver<T>, timeout: Option<Duration>) -> Result<T, RecvTimeoutError> {
    let deadline = timeout.map(|timeout| Instant::now() + timeout);
    loop {
        match rx.try_recv() {
            Ok(command) => return Ok(command),
            Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
            Err(TryRecvError::Empty) => {}
        }
        // A push between the look above and the park leaves the thread's
        // token set, and the park returns at once; a wake-up for nothing
        // (a token meant for another wait on this thread) only loops.
        match deadline {
            None => std::thread::park(),
            Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => std::thread::park_timeout(left),
                _ => return Err(RecvTimeoutError::Timeout),
            },
        }
    }
}
