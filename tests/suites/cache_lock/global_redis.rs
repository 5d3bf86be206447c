//! `#[cache_lock]` without `client = ...`: the process-wide client. Its own test binary,
//! because the client is installed once per process.

use lock_core::{LockClient, LockError};
use lock_macros::cache_lock;
use lock_tests::RedisServer;

#[cache_lock(prefix = "global", key = id)]
async fn job(id: u64) -> Result<u64, LockError> {
    Ok(id * 2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uses_the_installed_client_and_errors_clearly_before() {
    let e = job(1).await.unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    assert!(e.to_string().contains("install_global"), "{e}");

    let server = RedisServer::start();
    let client = LockClient::open(server.url().as_str()).await.unwrap();
    lock_core::install_global(client.clone()).unwrap();
    assert!(
        lock_core::install_global(client.clone()).is_err(),
        "installed twice"
    );
    assert_eq!(job(21).await.unwrap(), 42);

    let guard = client.try_lock(("global", 5_u64)).await.unwrap();
    assert!(job(5).await.unwrap_err().is_busy());
    guard.release().await.unwrap();
    assert_eq!(job(5).await.unwrap(), 10);
}
