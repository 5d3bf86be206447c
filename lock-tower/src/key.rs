//! The key of a request, as both keyed layers read it.

use http::Request;

/// Derives the key of a request: who it counts against for
/// [`RateLimitLayer`](crate::rate_limit::RateLimitLayer), which earlier request it
/// repeats for [`IdempotencyLayer`](crate::idempotency::IdempotencyLayer).
///
/// - `Ok(Some(key))`: the key.
/// - `Ok(None)`: the request carries none. The rate limit answers 400 (nobody to count
///   against; an empty key too); the idempotency layer passes the request unprotected,
///   or answers 400 when [keys are required](crate::idempotency::IdempotencyLayer::require_key).
/// - `Err(reason)`: the request carries a malformed key; either layer answers 400
///   problem+json with `reason`.
///
/// Each layer then takes the key its own way: the rate limit counts any key (one longer
/// than [`MAX_LITERAL_KEY_LEN`](crate::rate_limit::MAX_LITERAL_KEY_LEN) bytes under its
/// SHA-256); the idempotency layer wants 1 to
/// [`MAX_KEY_LEN`](crate::idempotency::MAX_KEY_LEN) printable ASCII characters (400
/// otherwise). Two spellings of one key (`7` and `007`) are two keys: normalize here
/// when the application treats them as one.
///
/// Implemented for closures `Fn(&Request<B>) -> Option<String>`; by
/// [`PeerIp`](crate::rate_limit::PeerIp),
/// [`ForwardedFor`](crate::rate_limit::ForwardedFor) and
/// [`rate_limit::HeaderKey`](crate::rate_limit::HeaderKey) (a header's value as is); and
/// by [`idempotency::HeaderKey`](crate::idempotency::HeaderKey) (an RFC 8941 sf-string
/// or a bare key).
///
/// ```
/// use http::Request;
/// use lock_tower::KeyExtractor;
///
/// /// A numeric user id, normalized; anything else is refused.
/// struct UserId;
///
/// impl<B> KeyExtractor<B> for UserId {
///     fn extract(&self, request: &Request<B>) -> Result<Option<String>, String> {
///         let Some(value) = request.headers().get("x-user-id") else {
///             return Ok(None);
///         };
///         let id: u64 = value
///             .to_str()
///             .ok()
///             .and_then(|v| v.parse().ok())
///             .ok_or("x-user-id is not a number")?;
///         Ok(Some(id.to_string()))
///     }
/// }
///
/// let r = |id: &str| Request::post("/").header("x-user-id", id).body(()).unwrap();
/// assert_eq!(UserId.extract(&r("007")), Ok(Some("7".to_string())));
/// assert!(UserId.extract(&r("bob")).is_err());
///
/// // A key made of two headers, from a closure.
/// let from_headers = |r: &Request<()>| {
///     let h = |n: &str| r.headers().get(n)?.to_str().ok().map(str::to_owned);
///     Some(format!("{}.{}", h("x-client")?, h("x-request-number")?))
/// };
/// let r = Request::post("/").header("x-client", "shop").header("x-request-number", "7").body(()).unwrap();
/// assert_eq!(from_headers.extract(&r), Ok(Some("shop.7".to_string())));
/// ```
pub trait KeyExtractor<B> {
    /// The key of `request`.
    fn extract(&self, request: &Request<B>) -> Result<Option<String>, String>;
}

impl<B, F> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<String>,
{
    fn extract(&self, request: &Request<B>) -> Result<Option<String>, String> {
        Ok(self(request))
    }
}
