//! SCRIPT FLUSH between calls: every script reloads on NOSCRIPT.

use crate::common;

use std::time::Duration;

use common::client;
use lock_core::{FencedWrite, LockConfig, LockScope, Released};
use lock_tests::RedisServer;

async fn flush(server: &RedisServer) {
    let mut raw = server.connection().await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_script_survives_script_flush() {
    let server = RedisServer::start();
    let config = LockConfig::new().with_watchdog_lease(Duration::from_millis(300));
    let c = client(&server, config).await;
    flush(&server).await;
    let scope = LockScope::new();
    let (g, g2) = scope
        .run(async {
            let g = c.lock("f").await.unwrap(); // acquire.lua
            flush(&server).await;
            let g2 = c.lock("f").await.unwrap(); // re-entered: counted in the client
            (g, g2)
        })
        .await;
    flush(&server).await;
    g.extend(Duration::from_millis(300)).await.unwrap(); // renew.lua
    flush(&server).await;
    // The watchdog's renewals (renew.lua, batched) keep it alive past several leases.
    let mut monitor = server.monitor().await;
    let lines = monitor.lines_within(Duration::from_millis(900)).await;
    // Lock scripts are sent as EVAL of their source after a NOSCRIPT reply (which
    // loads them again), the others through SCRIPT LOAD.
    assert!(
        lines
            .iter()
            .any(|l| l.contains("\"EVAL\"") && l.contains("renew.lua")),
        "no reload of renew.lua seen: {lines:?}"
    );
    assert!(g.is_held() && g2.is_held());
    flush(&server).await;
    flush(&server).await;
    let token = g.fence().await.unwrap(); // fence.lua
    flush(&server).await;
    let w = c.fenced_write("f", token, "v").await.unwrap(); // fenced_write.lua
    assert_eq!(w, FencedWrite::Written);
    flush(&server).await;
    assert_eq!(
        g2.release().await.unwrap(),
        Released::StillHeld { holds_left: 1 }
    ); // release.lua
    flush(&server).await;
    assert_eq!(g.release().await.unwrap(), Released::Unlocked);
}
