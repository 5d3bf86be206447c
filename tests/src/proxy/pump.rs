//! One proxied connection: its two forwarding threads, with the partition
//! ([`TcpProxy::cut`](super::TcpProxy::cut)) and the armed [`faults`](super::faults)
//! applied on the way.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;

use super::{BUFFER_SIZE, CONNECT_TIMEOUT, Shared, WRITE_SLICE};

/// Forwards one client connection until both directions are closed.
pub(super) fn serve(client: TcpStream, port: u16, target_port: u16, shared: &Arc<Shared>, id: u64) {
    // A partitioned client does not reach the server, not even to connect.
    if !shared.await_healed(id) {
        return;
    }
    let target = SocketAddr::from((Ipv4Addr::LOCALHOST, target_port));
    let Ok(upstream) = TcpStream::connect_timeout(&target, CONNECT_TIMEOUT) else {
        return; // Refused: the client's connection is closed.
    };
    let _ = upstream.set_nodelay(true);
    let (Ok(client_reader), Ok(upstream_reader), Ok(upstream_clone)) = (
        client.try_clone(),
        upstream.try_clone(),
        upstream.try_clone(),
    ) else {
        return;
    };
    if client.set_write_timeout(Some(WRITE_SLICE)).is_err()
        || upstream.set_write_timeout(Some(WRITE_SLICE)).is_err()
    {
        return;
    }
    {
        let mut state = shared.lock();
        let state = &mut *state;
        match state.connections.get_mut(&id) {
            Some(sockets) if !state.shutdown => sockets.push(upstream_clone),
            _ => return, // Shutting down.
        }
    }
    let downstream = std::thread::Builder::new()
        .name(format!("tcp-proxy-{port}-{id}-down"))
        .spawn({
            let shared = Arc::clone(shared);
            move || pump(upstream_reader, client, &shared, Pipe::Down(id))
        });
    match downstream {
        Ok(downstream) => {
            pump(client_reader, upstream, shared, Pipe::Up(id));
            let _ = downstream.join();
        }
        Err(e) => eprintln!("TcpProxy on port {port}: cannot spawn a connection thread: {e}"),
    }
}

/// One direction of connection `id`: client to server (`Up`) or back.
#[derive(Clone, Copy)]
enum Pipe {
    Up(u64),
    Down(u64),
}

/// Copies `from` to `to` until `from` is closed, then closes `to` for
/// writing (a FIN). Everything sent on `to`, the FIN included, waits while
/// the proxy is cut. Armed [faults](super::faults) are applied on the way.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared, pipe: Pipe) {
    let id = match pipe {
        Pipe::Up(id) | Pipe::Down(id) => id,
    };
    let mut buffer = vec![0; BUFFER_SIZE];
    loop {
        let read = from.read(&mut buffer);
        // A fault ended the connection: its close is the fault's, not forwarded.
        if shared.fault_ended(id) {
            return;
        }
        let len = match read {
            Ok(0) => {
                let _ = shared.forward(id, || to.shutdown(Shutdown::Write));
                return;
            }
            Ok(len) => len,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                // Reset (or closed by `Drop`): close the other side too.
                let _ = shared.forward(id, || to.shutdown(Shutdown::Both));
                return;
            }
        };
        match pipe {
            Pipe::Up(_) => {
                if let Some(fault) = shared.client_sent(id, &buffer[..len]) {
                    return shared.apply(fault, &buffer[..len], &from, &to);
                }
            }
            Pipe::Down(_) => {
                if let Some(fault) = shared.reply_fault(id) {
                    return shared.apply(fault, &buffer[..len], &to, &from);
                }
            }
        }
        let mut sent = 0;
        while sent < len {
            let Some(result) = shared.forward(id, || to.write(&buffer[sent..len])) else {
                return; // Shutting down.
            };
            match result {
                Ok(0) | Err(_) if shared.fault_ended(id) => return,
                Ok(0) => {
                    let _ = shared.forward(id, || from.shutdown(Shutdown::Both));
                    return;
                }
                Ok(written) => sent += written,
                // Let a pending `cut` in, then try again.
                Err(e) if write_again(&e) => {}
                Err(_) => {
                    // `to` is gone: close its counterpart as well.
                    let _ = shared.forward(id, || from.shutdown(Shutdown::Both));
                    return;
                }
            }
        }
    }
}

/// A write slice that elapsed with nothing written, or a signal that came: the write
/// is tried again.
pub(super) fn write_again(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}
