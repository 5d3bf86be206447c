//! Opening a client reads the server's version and refuses a Redis older than 7.0.
//! No Redis 6 is at hand, so a stand-in server on a local port answers `INFO server`
//! with the version under test and `+OK` to everything else (the connection's own
//! set-up commands).

use lock_core::{LockClient, LockError};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Serves RESP2 on a free port, answering `INFO` with `info`; returns its URL.
async fn fake_redis(info: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, info));
        }
    });
    url
}

async fn serve(stream: TcpStream, info: &'static str) -> std::io::Result<()> {
    let mut stream = BufReader::new(stream);
    loop {
        let command = read_command(&mut stream).await?;
        let reply = match command.first().map(|c| c.to_ascii_uppercase()) {
            Some(c) if c == "INFO" => format!("${}\r\n{info}\r\n", info.len()),
            _ => "+OK\r\n".to_string(),
        };
        stream.get_mut().write_all(reply.as_bytes()).await?;
    }
}

/// One command: an array of bulk strings.
async fn read_command(stream: &mut BufReader<TcpStream>) -> std::io::Result<Vec<String>> {
    let count = read_header(stream, '*').await?;
    let mut parts = Vec::with_capacity(count);
    for _ in 0..count {
        let len = read_header(stream, '$').await?;
        let mut data = vec![0; len + 2];
        stream.read_exact(&mut data).await?;
        data.truncate(len);
        parts.push(String::from_utf8_lossy(&data).into_owned());
    }
    Ok(parts)
}

async fn read_header(stream: &mut BufReader<TcpStream>, kind: char) -> std::io::Result<usize> {
    let mut line = String::new();
    if stream.read_line(&mut line).await? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    line.trim_end()
        .strip_prefix(kind)
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not a RESP {kind} header: {line:?}")))
}

#[tokio::test]
async fn an_old_redis_is_refused_at_open_with_what_was_found_and_what_is_needed() {
    let url = fake_redis("# Server\r\nredis_version:6.2.14\r\nredis_mode:standalone\r\n").await;
    let e = LockClient::open(url.as_str()).await.unwrap_err();
    assert!(
        matches!(&e, LockError::UnsupportedRedis { found, needed: "7.0" } if found == "6.2.14"),
        "{e:?}"
    );
    let message = e.to_string();
    assert!(
        message.contains("6.2.14")
            && message.contains("7.0 or newer")
            && message.contains("upgrade"),
        "{message}"
    );
}

#[tokio::test]
async fn redis_7_and_a_server_that_does_not_tell_are_accepted() {
    for info in [
        "# Server\r\nredis_version:7.0.0-rc1\r\n",
        "# Server\r\nredis_version:255.255.255\r\n",
        "# Server\r\nredis_mode:standalone\r\n",
    ] {
        let url = fake_redis(info).await;
        LockClient::open(url.as_str())
            .await
            .unwrap_or_else(|e| panic!("{info:?}: {e}"));
    }
}
