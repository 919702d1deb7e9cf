//! Zero-copy forwarding between two TCP sockets on Linux: `splice(2)` moves a bulk tunnel's
//! bytes from one socket into a pipe and from the pipe into the other socket, so they never
//! cross into user space. [`crate::proxy::pipe`] switches a direction to it once the direction
//! is busy (a read filled its buffer) and both ends are bare sockets; short exchanges and every
//! other stream (TLS, buffered bytes) keep the copy loop.
//!
//! A pipe is held only while bytes are in it: each transfer takes one from a small per-thread
//! cache (making one when the cache is empty) and gives it back once drained, so an idle tunnel
//! holds no pipe and a busy one at most one per direction. A pipe that still holds bytes after an
//! error is closed, never reused.

use std::cell::RefCell;
use std::io;
use std::os::fd::OwnedFd;

use rustix::pipe::{PipeFlags, SpliceFlags, pipe_with, splice};
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Bytes asked of the reading socket per transfer: a default pipe's capacity (16 pages). Pipes
/// of 256 KiB measured no different in CPU per GB or MB/s, and would count against the user's
/// pipe-buffer quota (`/proc/sys/fs/pipe-user-pages-soft`).
const PIPE_BYTES: usize = 64 * 1024;
/// Empty pipes each thread keeps for the next transfer: two descriptors each.
const CACHED_PIPES: usize = 16;

thread_local! {
    static PIPES: RefCell<Vec<Pipe>> = const { RefCell::new(Vec::new()) };
}

/// A pipe's two ends.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    /// An empty pipe from this thread's cache, or a new one; `None` when none can be made (out
    /// of descriptors): the caller copies instead.
    fn take() -> Option<Pipe> {
        if let Some(pipe) = PIPES.with(|p| p.borrow_mut().pop()) {
            return Some(pipe);
        }
        match pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK) {
            Ok((read, write)) => Some(Pipe { read, write }),
            Err(e) => {
                tracing::debug!(error = %e, "no pipe for splice; copying instead");
                None
            }
        }
    }

    /// Returns an empty pipe to this thread's cache (closed when the cache is full).
    fn give_back(self) {
        PIPES.with(|p| {
            let mut p = p.borrow_mut();
            if p.len() < CACHED_PIPES {
                p.push(self);
            }
        });
    }
}

/// Empty pipes in this thread's cache: a test's evidence that a transfer went by splice.
#[cfg(test)]
pub(crate) fn cached_pipes() -> usize {
    PIPES.with(|p| p.borrow().len())
}

/// What one transfer did.
#[derive(Debug)]
pub enum Spliced {
    /// Bytes moved from the reader to the writer.
    Moved(usize),
    /// The reader reached end of stream.
    Eof,
    /// The reading socket failed.
    ReadFailed(io::Error),
    /// The writing socket failed (the bytes in the pipe are lost with it).
    WriteFailed(io::Error),
    /// No pipe could be had: copy this chunk instead.
    NoPipe,
}

const FLAGS: SpliceFlags = SpliceFlags::MOVE.union(SpliceFlags::NONBLOCK);

/// Moves one chunk (up to [`PIPE_BYTES`]) from `from` to `to`: waits until `from` has bytes,
/// splices them into a pipe, then out of it into `to`, waiting for room as needed. The pipe is
/// taken only once bytes are there.
pub async fn transfer(from: &TcpStream, to: &TcpStream) -> Spliced {
    let (pipe, n) = loop {
        if let Err(e) = from.readable().await {
            return Spliced::ReadFailed(e);
        }
        let Some(pipe) = Pipe::take() else {
            return Spliced::NoPipe;
        };
        let read = from.try_io(Interest::READABLE, || {
            splice(from, None, &pipe.write, None, PIPE_BYTES, FLAGS).map_err(io::Error::from)
        });
        match read {
            Ok(0) => {
                pipe.give_back();
                return Spliced::Eof;
            }
            Ok(n) => break (pipe, n),
            // Readiness was stale: wait again, holding no pipe.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => pipe.give_back(),
            Err(e) => {
                pipe.give_back();
                return Spliced::ReadFailed(e);
            }
        }
    };
    let mut left = n;
    while left > 0 {
        let wrote = to.try_io(Interest::WRITABLE, || {
            splice(&pipe.read, None, to, None, left, FLAGS).map_err(io::Error::from)
        });
        match wrote {
            Ok(0) => return Spliced::WriteFailed(io::ErrorKind::WriteZero.into()),
            Ok(m) => left -= m.min(left),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if let Err(e) = to.writable().await {
                    return Spliced::WriteFailed(e);
                }
            }
            Err(e) => return Spliced::WriteFailed(e),
        }
    }
    pipe.give_back();
    Spliced::Moved(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::pipe::tests::socket_pair;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn moves_bytes_whole_and_in_order_then_sees_the_end() {
        // sender ⇄ [from | transfer | to] ⇄ receiver
        let (mut sender, from) = socket_pair().await;
        let (to, mut receiver) = socket_pair().await;
        let data: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        let send = async {
            sender.write_all(&data).await.unwrap();
            sender.shutdown().await.unwrap();
            sender
        };
        let len = data.len();
        let forward = async move {
            let mut moved = 0usize;
            // Bounded: every transfer but the last moves at least one byte.
            for _ in 0..len + 1 {
                match transfer(&from, &to).await {
                    Spliced::Moved(n) => moved += n,
                    // Dropping `to` ends the receiver's stream.
                    Spliced::Eof => return moved,
                    other => panic!("{other:?}"),
                }
            }
            panic!("no end of stream");
        };
        let mut got = Vec::new();
        let receive = receiver.read_to_end(&mut got);
        let (_sender, moved, received) =
            tokio::time::timeout(std::time::Duration::from_secs(60), async {
                tokio::join!(send, forward, receive)
            })
            .await
            .unwrap();
        received.unwrap();
        assert_eq!(moved, data.len());
        assert!(
            got == data,
            "{} of {} bytes, or out of order",
            got.len(),
            data.len()
        );
        // Every pipe went back to the cache, empty.
        assert!(cached_pipes() >= 1);
    }

    #[tokio::test]
    async fn a_writer_that_is_gone_is_a_write_failure() {
        let (mut sender, from) = socket_pair().await;
        let (to, receiver) = socket_pair().await;
        drop(receiver);
        let chunk = vec![7u8; 32 * 1024];
        let mut failed = false;
        // The peer's reset arrives after the first bytes: bounded retries.
        for _ in 0..50 {
            sender.write_all(&chunk).await.unwrap();
            match transfer(&from, &to).await {
                Spliced::Moved(_) => continue,
                Spliced::WriteFailed(_) => {
                    failed = true;
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(failed, "writing to a closed peer never failed");
    }
}
