//! The listener and its connections: one thread accepting on 127.0.0.1, one thread per
//! connection running TLS and HTTP/1.1 keep-alive, all of them stopped by `Shared::stop`.

use std::io::BufReader;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use rustls::{ServerConnection, StreamOwned};

use super::http::read_request;
use super::{api, lock, Shared};

/// The stream a handler writes its response to.
pub type Tls = StreamOwned<ServerConnection, TcpStream>;

/// Accepts until `shared.stop` is set (the stopper connects once to wake it).
pub fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    for tcp in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(tcp) = tcp else { continue };
        let _ = tcp.set_nodelay(true);
        let id = {
            let mut conns = lock(&shared.conns);
            conns.next_id += 1;
            let id = conns.next_id;
            if let Ok(clone) = tcp.try_clone() {
                conns.open.insert(id, (clone, false));
            }
            id
        };
        let s = shared.clone();
        threads.push(std::thread::spawn(move || {
            serve(&s, id, tcp);
            if let Some((t, _)) = lock(&s.conns).open.remove(&id) {
                let _ = t.shutdown(Shutdown::Both);
            }
        }));
        threads.retain(|t| !t.is_finished());
    }
    // Connections accepted just before the stop may have missed the stopper's sweep.
    for (tcp, _) in lock(&shared.conns).open.values() {
        let _ = tcp.shutdown(Shutdown::Both);
    }
    for t in threads {
        let _ = t.join();
    }
}

fn serve(shared: &Shared, id: u64, tcp: TcpStream) {
    let Ok(conn) = ServerConnection::new(shared.tls.clone()) else {
        return;
    };
    let mut tls = StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        if tls.conn.complete_io(&mut tls.sock).is_err() {
            return;
        }
    }
    let certs = tls.conn.peer_certificates().map(|c| c.to_vec());
    let mut reader = BufReader::new(tls);
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let req = match read_request(&mut reader) {
            Ok(Some(r)) => r,
            _ => return,
        };
        let close = req.wants_close();
        if api::handle(shared, id, certs.as_deref(), &req, reader.get_mut()).is_err() || close {
            break;
        }
    }
    let tls = reader.get_mut();
    tls.conn.send_close_notify();
    let _ = tls.conn.complete_io(&mut tls.sock);
}
