//! Pool events over Redis pub/sub: instances are told, they do not poll.
//!
//! One RESP3 connection per instance subscribes to every pool's channel
//! (`<prefix>:{<pool>}:events`). The scripts publish:
//! - `r`: a release (or a lease expiry) took an upstream off its cap; requests waiting for
//!   capacity in this instance try again;
//! - `m\n<origin>\n<upstream>\n<eligible>\n<keeps>\n<cost>`: a member setting changed; waiting
//!   requests try again, and a change decided by another instance is applied to the local view
//!   and handed to [`Store::subscribe_member_changes`](crate::store::Store::subscribe_member_changes);
//! - `l\n<origin>`: the members the pool's upstream lists contribute changed; other instances
//!   hear of it through [`Store::subscribe_listed_changes`](crate::store::Store::subscribe_listed_changes).
//!
//! The connection sends one PING every [`PING_INTERVAL`] to notice a silently dead peer, and is
//! re-established with backoff when lost; waiting requests are woken then, since events may have
//! been missed. On a cluster, a PUBLISH reaches subscribers on every node, so one connection to
//! any node is enough.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, PushInfo, PushKind, Value};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::Inner;
use super::conn::{RECONNECT_MAX, RECONNECT_MIN};
use crate::store::{MemberState, shard};
use crate::upstream::UpstreamId;

/// How often the events connection checks its peer; the only traffic of an idle instance.
pub const PING_INTERVAL: Duration = Duration::from_secs(30);

/// One event as published by the scripts.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Event {
    Released,
    Listed {
        origin: String,
    },
    Member {
        origin: String,
        upstream: String,
        state: MemberState,
    },
}

impl Event {
    pub fn parse(payload: &[u8]) -> Option<Event> {
        let text = std::str::from_utf8(payload).ok()?;
        if text == "r" {
            return Some(Event::Released);
        }
        let mut f = text.split('\n');
        match f.next()? {
            "m" => {}
            "l" => {
                return Some(Event::Listed {
                    origin: f.next().filter(|o| !o.is_empty())?.to_string(),
                });
            }
            _ => return None,
        }
        let origin = f.next()?.to_string();
        let upstream = f.next()?.to_string();
        let flag = |v: &str| match v {
            "1" => Some(true),
            "0" => Some(false),
            _ => None,
        };
        let eligible = flag(f.next()?)?;
        let keeps_sessions = flag(f.next()?)?;
        let cost = f.next()?.parse().ok()?;
        Some(Event::Member {
            origin,
            upstream,
            state: MemberState {
                eligible,
                keeps_sessions,
                cost,
            },
        })
    }
}

/// Keeps the subscription alive until the store is dropped.
pub(super) async fn run(inner: Arc<Inner>) {
    let mut channels = inner.channels.subscribe();
    let mut delay = RECONNECT_MIN;
    let mut lost = false;
    loop {
        if inner.stop.is_cancelled() {
            return;
        }
        match connect(&inner).await {
            Ok((conn, pushes)) => {
                if lost {
                    tracing::info!(store = %inner.redacted, "redis events connection back");
                }
                delay = RECONNECT_MIN;
                let why = serve(&inner, conn, pushes, &mut channels).await;
                inner.subscribed.send_replace(Default::default());
                if inner.stop.is_cancelled() {
                    return;
                }
                tracing::warn!(store = %inner.redacted, reason = why, "redis events connection lost; reconnecting");
                lost = true;
                // Releases and list changes may have been missed meanwhile.
                inner.notify_all();
                for name in inner.pool_names() {
                    let _ = inner.listed.send(shard::pool_of(&name).to_string());
                }
            }
            Err(why) => {
                tracing::debug!(store = %inner.redacted, reason = %why, "redis events connection failed");
                lost = true;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = inner.stop.cancelled() => return,
        }
        delay = (delay * 2).min(RECONNECT_MAX);
    }
}

async fn connect(
    inner: &Inner,
) -> Result<(MultiplexedConnection, UnboundedReceiver<PushInfo>), String> {
    let mut last = String::from("no node to connect to");
    for client in &inner.event_clients().await {
        let (tx, rx) = unbounded_channel();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(inner.timeout))
            .set_response_timeout(Some(inner.timeout.max(Duration::from_secs(1))))
            .set_push_sender(tx);
        let attempt = async {
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            redis::cmd("CLIENT")
                .arg("SETNAME")
                .arg(format!("{}:events", inner.client_name))
                .query_async::<()>(&mut conn)
                .await?;
            Ok::<_, redis::RedisError>(conn)
        };
        match tokio::time::timeout(inner.timeout.max(Duration::from_secs(1)), attempt).await {
            Ok(Ok(conn)) => return Ok((conn, rx)),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = "timed out".into(),
        }
    }
    Err(last)
}

/// Serves one connection until it fails; returns why.
async fn serve(
    inner: &Inner,
    mut conn: MultiplexedConnection,
    mut pushes: UnboundedReceiver<PushInfo>,
    channels: &mut tokio::sync::watch::Receiver<std::collections::BTreeSet<String>>,
) -> &'static str {
    let limit = inner.timeout.max(Duration::from_secs(1));
    let mut subscribed = std::collections::BTreeSet::new();
    let mut ping =
        tokio::time::interval_at(tokio::time::Instant::now() + PING_INTERVAL, PING_INTERVAL);
    loop {
        let wanted = channels.borrow_and_update().clone();
        for channel in wanted.difference(&subscribed) {
            match tokio::time::timeout(limit, conn.subscribe(channel)).await {
                Ok(Ok(())) => {}
                _ => return "subscribe failed",
            }
        }
        if subscribed != wanted {
            subscribed = wanted;
            inner.subscribed.send_replace(subscribed.clone());
        }
        tokio::select! {
            push = pushes.recv() => match push {
                None => return "connection closed",
                Some(p) if p.kind == PushKind::Disconnection => return "disconnected",
                Some(p) if p.kind == PushKind::Message => on_message(inner, p.data).await,
                Some(_) => {}
            },
            changed = channels.changed() => {
                if changed.is_err() {
                    return "store dropped";
                }
            }
            _ = ping.tick() => {
                let pong = tokio::time::timeout(
                    limit,
                    redis::cmd("PING").query_async::<Value>(&mut conn),
                )
                .await;
                if !matches!(pong, Ok(Ok(_))) {
                    return "ping failed";
                }
            }
            _ = inner.stop.cancelled() => return "stopped",
        }
    }
}

async fn on_message(inner: &Inner, data: Vec<Value>) {
    let mut data = data.into_iter();
    let (Some(channel), Some(payload)) = (data.next(), data.next()) else {
        return;
    };
    let Ok(channel) = redis::from_redis_value::<String>(channel) else {
        return;
    };
    let Ok(payload) = redis::from_redis_value::<Vec<u8>>(payload) else {
        return;
    };
    let Some(pool) = inner
        .pools
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|(_, p)| p.keys.events == channel)
        .map(|(name, p)| (name.clone(), p.clone()))
    else {
        return;
    };
    let (name, p) = pool;
    match Event::parse(&payload) {
        Some(Event::Released) => p.wake(),
        Some(Event::Member {
            origin,
            upstream,
            state,
        }) => {
            p.members_changed();
            if origin != inner.instance {
                inner
                    .member_changed_elsewhere(&name, UpstreamId::new(upstream), state)
                    .await;
            }
        }
        Some(Event::Listed { origin }) => {
            if origin != inner.instance {
                let _ = inner.listed.send(shard::pool_of(&name).to_string());
            }
        }
        None => tracing::debug!(channel, "unreadable pool event"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_parse() {
        assert_eq!(Event::parse(b"r"), Some(Event::Released));
        assert_eq!(
            Event::parse(b"m\nhost-1-ab\nhttp://10.0.0.1:3128\n0\n1\n4"),
            Some(Event::Member {
                origin: "host-1-ab".into(),
                upstream: "http://10.0.0.1:3128".into(),
                state: MemberState {
                    eligible: false,
                    keeps_sessions: true,
                    cost: 4
                }
            })
        );
        assert_eq!(Event::parse(b"m\na\nb\n2\n1\n1"), None);
        assert_eq!(
            Event::parse(b"l\nhost-2-cd"),
            Some(Event::Listed {
                origin: "host-2-cd".into()
            })
        );
        assert_eq!(Event::parse(b"l\n"), None);
        assert_eq!(Event::parse(b"x"), None);
    }
}
