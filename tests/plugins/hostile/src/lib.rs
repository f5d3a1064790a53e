//! Test plugin that misbehaves on purpose, as chosen by config `mode`:
//! `loop`, `bomb`, `panic`, `forbidden`, `many`, `huge` attack the host's limits;
//! `fs`, `env`, `socket`, `clock` try to reach outside the sandbox. If such an attempt
//! *succeeds*, the plugin publishes what it found to `<topic_prefix>leak`, so a test sees the
//! leak; if it fails, the row fails with a permanent error saying what was denied.

use sluice_plugin_sdk::{Config, Message, OutboxRow, Plugin, TransformError};

struct Hostile {
    mode: String,
    prefix: String,
}

impl Hostile {
    fn leak(&self, what: String) -> Result<Vec<Message>, TransformError> {
        Ok(vec![
            Message::to(format!("{}leak", self.prefix)).payload(what.into_bytes()),
        ])
    }
}

impl Plugin for Hostile {
    const NAME: &'static str = "test-hostile";
    const VERSION: &'static str = "0.1.0";

    fn configure(config: Config) -> Result<Self, String> {
        config.allow_only(&["mode", "topic_prefix"])?;
        Ok(Self {
            mode: config.require("mode")?.to_owned(),
            prefix: config.require("topic_prefix")?.to_owned(),
        })
    }

    fn transform(&self, row: OutboxRow) -> Result<Vec<Message>, TransformError> {
        let denied = |code: &str, e: String| Err(TransformError::permanent(code, e));
        match self.mode.as_str() {
            "loop" => loop {
                std::hint::spin_loop();
            },
            "bomb" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![7u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            "panic" => panic!("hostile plugin panics on row {}", row.id),
            "forbidden" => Ok(vec![Message::to("forbidden.topic").payload(row.payload)]),
            "many" => Ok((0..5_000)
                .map(|i| Message::to(format!("{}good", self.prefix)).key(i.to_string()))
                .collect()),
            "huge" => Ok(vec![
                Message::to(format!("{}good", self.prefix)).payload(vec![b'x'; 2 << 20]),
            ]),
            "fs" => match std::fs::read_to_string("/etc/passwd") {
                Ok(text) => self.leak(text),
                Err(e) => denied("fs-denied", e.to_string()),
            },
            "env" => {
                let vars: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
                if vars.is_empty() {
                    denied("env-denied", "no environment variables".into())
                } else {
                    self.leak(vars.join("\n"))
                }
            }
            "socket" => match std::net::TcpStream::connect("127.0.0.1:5432") {
                Ok(_) => self.leak("connected to 127.0.0.1:5432".into()),
                Err(e) => denied("socket-denied", e.to_string()),
            },
            "clock" => {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                if secs > 1_000_000_000 {
                    self.leak(format!("the time is {secs}"))
                } else {
                    denied("clock-denied", format!("the clock reads {secs}"))
                }
            }
            other => denied("bad-mode", format!("unknown mode {other}")),
        }
    }
}

sluice_plugin_sdk::plugin!(Hostile);
