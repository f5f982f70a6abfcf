//! A scripted HTTP/1.1 server on 127.0.0.1 for provider tests: per route a queue of replies
//! (the last one repeats), every request recorded. Only loopback, every wait bounded.

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub enum Reply {
    /// Status and body.
    Body(u16, String),
    /// Promises the whole body in Content-Length, sends the first half, closes.
    CutShort(String),
    /// Says nothing for this long, then closes (the client should time out first).
    Hang(Duration),
    /// 500 whose body echoes the request's Authorization header (a careless proxy).
    EchoAuth,
}

#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    pub target: String,
    pub head: String,
    pub body: String,
}

type Routes = HashMap<String, VecDeque<Reply>>;

pub struct Server {
    pub addr: SocketAddr,
    routes: Arc<Mutex<Routes>>,
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Server {
    pub fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let routes: Arc<Mutex<Routes>> = Arc::default();
        let requests: Arc<Mutex<Vec<Request>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (r, q, s) = (routes.clone(), requests.clone(), stop.clone());
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (r, q) = (r.clone(), q.clone());
                        std::thread::spawn(move || serve(stream, &r, &q));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Server {
            addr,
            routes,
            requests,
            stop,
            handle: Some(handle),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Queues replies for `"GET /path"` (matched without the query string).
    pub fn script(&self, route: &str, replies: Vec<Reply>) {
        self.routes
            .lock()
            .unwrap()
            .insert(route.to_string(), replies.into());
    }

    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn serve(mut stream: TcpStream, routes: &Mutex<Routes>, requests: &Mutex<Vec<Request>>) {
    stream.set_nonblocking(false).ok();
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok();
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        if Instant::now() > deadline {
            return;
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let len = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    while buf.len() < head_end + len && Instant::now() < deadline {
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let body = String::from_utf8_lossy(&buf[head_end..]).to_string();
    let first = head.lines().next().unwrap_or("").to_string();
    let mut parts = first.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let path = target.split('?').next().unwrap_or("").to_string();
    requests.lock().unwrap().push(Request {
        method: method.clone(),
        target,
        head: head.clone(),
        body,
    });
    let reply = {
        let mut routes = routes.lock().unwrap();
        match routes.get_mut(&format!("{method} {path}")) {
            Some(q) if q.len() > 1 => q.pop_front().unwrap(),
            Some(q) if q.len() == 1 => q[0].clone(),
            _ => Reply::Body(404, r#"{"error":{"code":"not-found"}}"#.into()),
        }
    };
    let respond = |stream: &mut TcpStream, status: u16, body: &str, send: usize| {
        let text = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let _ = stream.write_all(text.as_bytes());
        let _ = stream.write_all(&body.as_bytes()[..send]);
        let _ = stream.flush();
    };
    match reply {
        Reply::Body(status, body) => respond(&mut stream, status, &body, body.len()),
        Reply::CutShort(body) => respond(&mut stream, 200, &body, body.len() / 2),
        Reply::Hang(d) => std::thread::sleep(d),
        Reply::EchoAuth => {
            let auth = head
                .lines()
                .find(|l| l.to_ascii_lowercase().starts_with("authorization:"))
                .unwrap_or("")
                .to_string();
            let body = format!(r#"{{"error":{{"message":"bad request, you sent {auth}"}}}}"#);
            respond(&mut stream, 500, &body, body.len());
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A recognisable fake key that must never show up anywhere.
pub const PLANTED_KEY: &str = "labtest-PLANTED-KEY-9f8e7d6c5b4a";
