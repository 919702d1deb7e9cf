//! Calls that carry many requests' work at once (group commit).
//!
//! Every script run costs Redis a fixed price (the call, its arguments, the Lua frame, a GC step)
//! on top of its commands, and costs the gateway a command to encode and a reply to parse. Under
//! load that fixed price was most of the bill. A [`Batcher`] lets at most `max_calls` calls of one
//! kind be under way; work that arrives meanwhile waits, and the next call carries all of it (up
//! to `max_batch` items). No timer is involved: when Redis is idle an item goes at once, as before,
//! and the busier Redis is, the more each call carries. Each item sent gets its own answer, and
//! its sender waits for it, so what a sender reads afterwards includes its item. An item posted
//! instead has nobody waiting: the call itself must handle what happens to it.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

use super::{Fault, locked};

type Answer<R> = oneshot::Sender<Result<R, Fault>>;

pub(super) struct Batcher<T, R> {
    state: Mutex<State<T, R>>,
    max_batch: usize,
    max_calls: usize,
    /// Where the sending tasks run, so a shutdown can wait for posted work to go out.
    tasks: TaskTracker,
}

struct State<T, R> {
    /// Each item with where its answer goes (`None`: posted, nobody waits).
    waiting: VecDeque<(T, Option<Answer<R>>)>,
    /// Tasks sending calls; each takes what waits until nothing does.
    calls: usize,
}

impl<T: Send + 'static, R: Send + 'static> Batcher<T, R> {
    pub(super) fn new(max_batch: usize, max_calls: usize, tasks: TaskTracker) -> Self {
        Batcher {
            state: Mutex::new(State {
                waiting: VecDeque::new(),
                calls: 0,
            }),
            max_batch: max_batch.max(1),
            max_calls: max_calls.max(1),
            tasks,
        }
    }

    /// Queues `item` and waits for its answer. `call()` makes what sends one batch and answers
    /// each of its items in order; it is only made when this item starts a new sending task.
    pub(super) async fn send<C, F, Fut>(self: &Arc<Self>, item: T, call: C) -> Result<R, Fault>
    where
        C: FnOnce() -> F,
        F: FnMut(Vec<T>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Vec<R>, Fault>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        self.queue(item, Some(tx), call);
        rx.await
            .unwrap_or_else(|_| Err(Fault::Down("the call carrying it was abandoned".into())))
    }

    /// Queues `item` without waiting: for work whose outcome the call handles itself, so the
    /// poster needs no task of its own to wait in.
    pub(super) fn post<C, F, Fut>(self: &Arc<Self>, item: T, call: C)
    where
        C: FnOnce() -> F,
        F: FnMut(Vec<T>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Vec<R>, Fault>> + Send + 'static,
    {
        self.queue(item, None, call);
    }

    fn queue<C, F, Fut>(self: &Arc<Self>, item: T, answer: Option<Answer<R>>, call: C)
    where
        C: FnOnce() -> F,
        F: FnMut(Vec<T>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Vec<R>, Fault>> + Send + 'static,
    {
        let start = {
            let mut s = locked(&self.state);
            s.waiting.push_back((item, answer));
            let start = s.calls < self.max_calls;
            if start {
                s.calls += 1;
            }
            start
        };
        if start {
            self.tasks.spawn(drain(
                Slot {
                    batcher: self.clone(),
                    done: false,
                },
                call(),
            ));
        }
    }
}

/// One sending task's place in [`State::calls`]. A task that ends early (the runtime shuts down)
/// gives it back here, and when it was the last one, the items left waiting are answered `Down`
/// (their senders keep them for replay) instead of waiting forever; posted ones are dropped with
/// the runtime.
struct Slot<T, R> {
    batcher: Arc<Batcher<T, R>>,
    /// The place was given back with the queue found empty, under the same lock.
    done: bool,
}

impl<T, R> Drop for Slot<T, R> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut s = locked(&self.batcher.state);
        s.calls -= 1;
        if s.calls == 0 {
            s.waiting.clear();
        }
    }
}

async fn drain<T, R, F, Fut>(mut slot: Slot<T, R>, mut call: F)
where
    F: FnMut(Vec<T>) -> Fut,
    Fut: Future<Output = Result<Vec<R>, Fault>>,
{
    loop {
        let (items, answers): (Vec<T>, Vec<Option<Answer<R>>>) = {
            let b = &slot.batcher;
            let mut s = locked(&b.state);
            if s.waiting.is_empty() {
                s.calls -= 1;
                slot.done = true;
                return;
            }
            let n = s.waiting.len().min(b.max_batch);
            s.waiting.drain(..n).unzip()
        };
        match call(items).await {
            Ok(replies) => {
                let mut replies = replies.into_iter();
                for a in answers {
                    let r = replies
                        .next()
                        .ok_or_else(|| Fault::Broken("a batch reply is short".into()));
                    if let Some(a) = a {
                        let _ = a.send(r);
                    }
                }
            }
            Err(f) => {
                for a in answers.into_iter().flatten() {
                    let _ = a.send(Err(f.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    type Calls = Arc<Mutex<Vec<Vec<u32>>>>;
    type Reply = std::pin::Pin<Box<dyn Future<Output = Result<Vec<u32>, Fault>> + Send>>;

    /// A call that records its items, answers each with ten times itself, fails a batch holding
    /// 13, and holds its first call until `open`.
    fn caller(
        calls: Calls,
        open: tokio::sync::watch::Receiver<bool>,
    ) -> impl FnMut(Vec<u32>) -> Reply + Send + 'static {
        move |items: Vec<u32>| {
            let (calls, mut open) = (calls.clone(), open.clone());
            Box::pin(async move {
                let first = {
                    let mut c = calls.lock().unwrap();
                    c.push(items.clone());
                    c.len() == 1
                };
                if first {
                    let _ = open.wait_for(|o| *o).await;
                }
                if items.contains(&13) {
                    return Err(Fault::Down("thirteen".into()));
                }
                Ok(items.iter().map(|i| i * 10).collect())
            })
        }
    }

    /// Items that arrive while a call is under way go together in the next calls (at most
    /// `max_batch` each), each item gets its own answer, and a failed call answers every item it
    /// carried with the failure.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiting_items_share_the_next_call_and_get_their_own_answers() {
        let b: Arc<Batcher<u32, u32>> = Arc::new(Batcher::new(50, 1, TaskTracker::new()));
        let calls: Calls = Arc::default();
        let (open_tx, open_rx) = tokio::sync::watch::channel(false);
        let mut set = tokio::task::JoinSet::new();
        for i in 0..=120u32 {
            let (b, call) = (b.clone(), caller(calls.clone(), open_rx.clone()));
            set.spawn(async move { (i, b.send(i, || call).await) });
            if i == 0 {
                // The first call is under way before anything else is queued.
                for _ in 0..2000 {
                    if !calls.lock().unwrap().is_empty() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                assert_eq!(calls.lock().unwrap().len(), 1);
            }
        }
        for _ in 0..2000 {
            if locked(&b.state).waiting.len() == 120 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(locked(&b.state).waiting.len(), 120);
        open_tx.send(true).unwrap();
        let mut answered = 0;
        while let Some(r) = tokio::time::timeout(Duration::from_secs(10), set.join_next())
            .await
            .expect("every item answered")
        {
            let (i, r) = r.unwrap();
            let failed_batch = calls
                .lock()
                .unwrap()
                .iter()
                .any(|c| c.contains(&i) && c.contains(&13));
            match r {
                Ok(v) => assert!(!failed_batch && v == i * 10, "{i}: {v}"),
                Err(Fault::Down(why)) => assert!(failed_batch && why == "thirteen", "{i}"),
                Err(other) => panic!("{i}: {other:?}"),
            }
            answered += 1;
        }
        assert_eq!(answered, 121);
        let sizes: Vec<usize> = calls.lock().unwrap().iter().map(Vec::len).collect();
        assert_eq!(
            sizes,
            [1, 50, 50, 20],
            "one call alone, then the 120 waiting in three"
        );
        assert_eq!(locked(&b.state).calls, 0, "no sending task left");
    }

    /// With room for two calls at once, an item that arrives while one call is under way goes at
    /// once in a second call instead of waiting.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_call_starts_while_the_first_is_under_way() {
        let b: Arc<Batcher<u32, u32>> = Arc::new(Batcher::new(50, 2, TaskTracker::new()));
        let calls: Calls = Arc::default();
        let (open_tx, open_rx) = tokio::sync::watch::channel(false);
        let first = {
            let (b, call) = (b.clone(), caller(calls.clone(), open_rx.clone()));
            tokio::spawn(async move { b.send(1, || call).await })
        };
        for _ in 0..2000 {
            if !calls.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let second = tokio::time::timeout(
            Duration::from_secs(10),
            b.send(2, || caller(calls.clone(), open_rx.clone())),
        )
        .await
        .expect("not held behind the first call");
        assert_eq!(second.unwrap(), 20);
        open_tx.send(true).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 10);
    }

    /// A posted item needs nobody to wait: its call carries it all the same, with the items sent
    /// meanwhile, and the tracker the batcher was given holds the call until it has ended (what a
    /// shutdown waits for).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn posted_items_go_out_and_the_tracker_waits_for_their_call() {
        let tasks = TaskTracker::new();
        let b: Arc<Batcher<u32, u32>> = Arc::new(Batcher::new(50, 1, tasks.clone()));
        let calls: Calls = Arc::default();
        let (open_tx, open_rx) = tokio::sync::watch::channel(false);
        b.post(1, || caller(calls.clone(), open_rx.clone()));
        for _ in 0..2000 {
            if !calls.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        b.post(2, || caller(calls.clone(), open_rx.clone()));
        let sent = {
            let b = b.clone();
            let call = caller(calls.clone(), open_rx.clone());
            tokio::spawn(async move { b.send(3, || call).await })
        };
        tasks.close();
        let early = tokio::time::timeout(Duration::from_millis(50), tasks.wait()).await;
        assert!(early.is_err(), "the held call is still under way");
        open_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(10), tasks.wait())
            .await
            .expect("the call ends once let go");
        assert_eq!(
            sent.await.unwrap().unwrap(),
            30,
            "the sent item's own answer"
        );
        assert_eq!(*calls.lock().unwrap(), [vec![1], vec![2, 3]]);
        assert_eq!(locked(&b.state).calls, 0, "no sending task left");
    }
}
