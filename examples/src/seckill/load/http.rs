//! A small HTTP/1 client for the load generator and the tests (hyper, pooled).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::seckill::instances::BoxError;

/// Time limit of one request, connection included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A response, read whole.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// `Idempotent-Replayed: true` was present.
    pub replayed: bool,
    /// The `Content-Type` header (empty if absent).
    pub content_type: String,
    /// The `Location` header, if any.
    pub location: Option<String>,
    /// The `Retry-After` header, if any.
    pub retry_after: Option<String>,
    /// The body.
    pub body: Bytes,
    /// Time from sending to the end of the body.
    pub latency: Duration,
}

impl Reply {
    /// The body as JSON (`Null` if it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The problem `type` of an error body, if any.
    pub fn problem_type(&self) -> Option<String> {
        self.json().get("type")?.as_str().map(str::to_owned)
    }
}

/// A pooled client; cheap to clone.
#[derive(Debug, Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for Http {
    fn default() -> Self {
        Self::new()
    }
}

impl Http {
    /// A client with an idle-connection pool.
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Self {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(connector),
        }
    }

    /// Sends `method url` with `headers` and `body`; transport errors and timeouts are
    /// errors, every status is a [`Reply`].
    pub async fn send(
        &self,
        method: http::Method,
        url: &str,
        headers: &[(&str, String)],
        body: Option<String>,
    ) -> Result<Reply, BoxError> {
        let mut request = http::Request::builder().method(method).uri(url);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        if body.is_some() {
            request = request.header("content-type", "application/json");
        }
        let request = request.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let started = Instant::now();
        let exchange = async {
            let response = self.client.request(request).await?;
            let (parts, body) = response.into_parts();
            let body = body.collect().await?.to_bytes();
            Ok::<_, BoxError>((parts, body))
        };
        let (parts, body) = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| format!("no answer from {url} within {REQUEST_TIMEOUT:?}"))??;
        Ok(Reply {
            status: parts.status.as_u16(),
            replayed: parts
                .headers
                .get("idempotent-replayed")
                .is_some_and(|v| v == "true"),
            content_type: parts
                .headers
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned(),
            location: parts
                .headers
                .get("location")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            retry_after: parts
                .headers
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            body,
            latency: started.elapsed(),
        })
    }

    /// `GET url`.
    pub async fn get(&self, url: &str) -> Result<Reply, BoxError> {
        self.send(http::Method::GET, url, &[], None).await
    }

    /// `POST url` with a JSON body.
    pub async fn post_json(&self, url: &str, body: String) -> Result<Reply, BoxError> {
        self.send(http::Method::POST, url, &[], Some(body)).await
    }

    /// `POST {base}/vouchers` with `spec` (`{"stock": N, ...}`): the new voucher's id,
    /// or an error with the status and body of any other answer.
    pub async fn create_voucher(&self, base: &str, spec: String) -> Result<i64, BoxError> {
        let created = self.post_json(&format!("{base}/vouchers"), spec).await?;
        let id = created.json().get("id").and_then(serde_json::Value::as_i64);
        id.filter(|_| created.status == 201).ok_or_else(|| {
            format!(
                "creating the voucher failed: {} {}",
                created.status,
                String::from_utf8_lossy(&created.body)
            )
            .into()
        })
    }

    /// `POST {base}/vouchers/{voucher}/orders` as `user` with `key`.
    pub async fn order(
        &self,
        base: &str,
        voucher: i64,
        user: i64,
        key: &str,
    ) -> Result<Reply, BoxError> {
        self.send(
            http::Method::POST,
            &format!("{base}/vouchers/{voucher}/orders"),
            &[
                ("x-user-id", user.to_string()),
                ("idempotency-key", key.to_string()),
            ],
            None,
        )
        .await
    }
}
