//! What Sluice's PostgreSQL connections send in their start-up message, read by a fake server:
//! PgBouncer refuses a connection whose start-up parameters it does not know (sqlx's default
//! `extra_float_digits`) unless configured to ignore them.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpListener;

use sqlx::Connection;
use sqlx::postgres::PgConnection;

use super::connect_options;

/// The SSLRequest code of the PostgreSQL protocol.
const SSL_REQUEST: u32 = 80_877_103;

/// Accepts one connection, declines TLS, and returns the start-up message's parameters.
fn read_startup(listener: &TcpListener) -> HashMap<String, String> {
    let (mut socket, _) = listener.accept().expect("accept");
    let read_message = |socket: &mut std::net::TcpStream| {
        let mut len = [0u8; 4];
        socket.read_exact(&mut len).expect("length");
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize - 4];
        socket.read_exact(&mut body).expect("body");
        body
    };
    let mut body = read_message(&mut socket);
    if body.len() == 4 && u32::from_be_bytes([body[0], body[1], body[2], body[3]]) == SSL_REQUEST {
        socket.write_all(b"N").expect("decline TLS");
        body = read_message(&mut socket);
    }
    // Protocol version, then name/value C strings, ended by an empty name.
    let fields: Vec<String> = body[4..]
        .split(|b| *b == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    fields
        .chunks(2)
        .take_while(|pair| pair.len() == 2 && !pair[0].is_empty())
        .map(|pair| (pair[0].clone(), pair[1].clone()))
        .collect()
}

#[tokio::test]
async fn connections_send_no_extra_float_digits_and_name_themselves() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    let server = std::thread::spawn(move || read_startup(&listener));
    let options =
        connect_options(&format!("postgres://relay@127.0.0.1:{port}/app")).expect("options");
    // The fake server hangs up after the start-up message: the connection fails.
    let _ = PgConnection::connect_with(&options).await;
    let params = server.join().expect("fake server");
    assert_eq!(params.get("user").map(String::as_str), Some("relay"));
    assert_eq!(
        params.get("application_name").map(String::as_str),
        Some("sluice")
    );
    assert!(!params.contains_key("extra_float_digits"), "{params:?}");
}
