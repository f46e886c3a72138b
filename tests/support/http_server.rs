//! A plain HTTP server on 127.0.0.1, for a client the test points at it (the static pod
//! URL): it answers every request with what the test set last, records each request
//! head, and can go away and come back on the same port. Each connection gets a thread
//! of its own; every thread ends once the server is stopped or dropped.

#![allow(dead_code)]

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::https_stub::{read_head, response, Head};

pub struct HttpServer {
    pub addr: SocketAddr,
    answer: Arc<Mutex<(u16, Vec<u8>)>>,
    heads: Arc<Mutex<Vec<Head>>>,
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl HttpServer {
    /// Serves `200` with an empty body until told otherwise, on a free port.
    pub fn start() -> HttpServer {
        HttpServer::start_on(0)
    }

    /// As [`HttpServer::start`], on `port` (0 for a free one): a server that went away
    /// comes back where its clients look for it.
    pub fn start_on(port: u16) -> HttpServer {
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind http server");
        let addr = listener.local_addr().expect("addr");
        let mut server = HttpServer {
            addr,
            answer: Arc::new(Mutex::new((200, Vec::new()))),
            heads: Arc::new(Mutex::new(Vec::new())),
            stop: Arc::new(AtomicBool::new(false)),
            accept: None,
        };
        let (answer, heads, stop) = (
            server.answer.clone(),
            server.heads.clone(),
            server.stop.clone(),
        );
        server.accept = Some(std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(tcp) = conn else { continue };
                let (answer, heads) = (answer.clone(), heads.clone());
                std::thread::spawn(move || serve(tcp, &answer, &heads));
            }
        }));
        server
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// What every request gets from now on.
    pub fn answer(&self, status: u16, body: impl Into<Vec<u8>>) {
        *self.answer.lock().unwrap_or_else(PoisonError::into_inner) = (status, body.into());
    }

    /// Every request head so far, in order.
    pub fn heads(&self) -> Vec<Head> {
        self.heads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which sees the stop and closes the listener: once
        // dropped, the port refuses connections and is free to serve again.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

fn serve(mut tcp: TcpStream, answer: &Mutex<(u16, Vec<u8>)>, heads: &Mutex<Vec<Head>>) {
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = tcp.set_write_timeout(Some(Duration::from_secs(10)));
    let Some(head) = read_head(&mut tcp) else {
        return;
    };
    heads
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(head.clone());
    let (status, body) = answer
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let _ = tcp.write_all(&response(status, "", &body, &head));
    let _ = tcp.flush();
}
