//! The arguments of `#[cache_lock(...)]`.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream};
use syn::{Expr, Ident, LitInt, LitStr, Token};

mod kw {
    syn::custom_keyword!(prefix);
    syn::custom_keyword!(key);
    syn::custom_keyword!(expire);
    syn::custom_keyword!(wait);
    syn::custom_keyword!(release);
    syn::custom_keyword!(delimiter);
    syn::custom_keyword!(client);
    syn::custom_keyword!(hold);
}

const ARGUMENTS: &str = "prefix, key, expire, wait, release, delimiter, client, hold";

/// The kind of hold `hold = "..."` asks for.
#[derive(Clone, Copy)]
pub(crate) enum Hold {
    Exclusive,
    Fair,
    Read,
    Write,
}

/// Shortest lease lock-core accepts, in milliseconds.
const MIN_LEASE_MS: u64 = 10;
/// Longest fixed lease lock-core accepts, in milliseconds.
const MAX_LEASE_MS: u64 = 24 * 60 * 60 * 1000;

/// One key part: an argument or binding, then field accesses (`order.user_id`).
pub(crate) struct KeyPath {
    pub(crate) root: Ident,
    pub(crate) tokens: TokenStream,
}

/// A duration argument, in milliseconds, with the literal it came from.
pub(crate) struct Millis {
    pub(crate) ms: u64,
    pub(crate) span: Span,
}

#[derive(Default)]
pub(crate) struct Args {
    pub(crate) prefix: Option<LitStr>,
    pub(crate) key: Option<Vec<KeyPath>>,
    pub(crate) expire: Option<Millis>,
    pub(crate) wait: Option<Millis>,
    /// `Some(span)` when `release = "on_expiry"`.
    pub(crate) release: Option<(bool, Span)>,
    pub(crate) delimiter: Option<LitStr>,
    pub(crate) client: Option<Expr>,
    pub(crate) hold: Option<Hold>,
}

/// Stores an argument, or fails if it was given before: the one check for repeats.
fn set_once<T>(slot: &mut Option<T>, value: T, name: &str, span: Span) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            span,
            format!("`{name}` is given more than once"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

impl Parse for Args {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let mut args = Args::default();
        while !input.is_empty() {
            let lookahead = input.lookahead1();
            let name = input.fork().call(Ident::parse_any)?;
            let span = name.span();
            if lookahead.peek(kw::prefix) {
                input.parse::<kw::prefix>()?;
                input.parse::<Token![=]>()?;
                let lit: LitStr = input.parse()?;
                if lit.value().is_empty() {
                    return Err(syn::Error::new(lit.span(), "`prefix` must not be empty"));
                }
                set_once(&mut args.prefix, lit, "prefix", span)?;
            } else if lookahead.peek(kw::key) {
                input.parse::<kw::key>()?;
                input.parse::<Token![=]>()?;
                set_once(&mut args.key, parse_key(input)?, "key", span)?;
            } else if lookahead.peek(kw::expire) {
                input.parse::<kw::expire>()?;
                input.parse::<Token![=]>()?;
                let d = parse_duration(input)?;
                if d.ms < MIN_LEASE_MS || d.ms > MAX_LEASE_MS {
                    return Err(syn::Error::new(
                        d.span,
                        "`expire` must be between 10ms and 24h; leave it out to have the \
                         watchdog renew the lock while the body runs",
                    ));
                }
                set_once(&mut args.expire, d, "expire", span)?;
            } else if lookahead.peek(kw::wait) {
                input.parse::<kw::wait>()?;
                input.parse::<Token![=]>()?;
                set_once(&mut args.wait, parse_duration(input)?, "wait", span)?;
            } else if lookahead.peek(kw::release) {
                input.parse::<kw::release>()?;
                input.parse::<Token![=]>()?;
                let lit: LitStr = input.parse()?;
                let keep = match lit.value().as_str() {
                    "on_return" => false,
                    "on_expiry" => true,
                    other => {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!(
                                "unknown `release` value {other:?}: use \"on_return\" \
                                 (the default) or \"on_expiry\""
                            ),
                        ));
                    }
                };
                set_once(&mut args.release, (keep, lit.span()), "release", span)?;
            } else if lookahead.peek(kw::delimiter) {
                input.parse::<kw::delimiter>()?;
                input.parse::<Token![=]>()?;
                let lit: LitStr = input.parse()?;
                let v = lit.value();
                if v.is_empty() || v.len() > 8 || v.contains(['{', '}', '%']) {
                    return Err(syn::Error::new(
                        lit.span(),
                        "`delimiter` must be 1 to 8 bytes without `{`, `}` or `%`",
                    ));
                }
                set_once(&mut args.delimiter, lit, "delimiter", span)?;
            } else if lookahead.peek(kw::hold) {
                input.parse::<kw::hold>()?;
                input.parse::<Token![=]>()?;
                let lit: LitStr = input.parse()?;
                let hold = match lit.value().as_str() {
                    "exclusive" => Hold::Exclusive,
                    "fair" => Hold::Fair,
                    "read" => Hold::Read,
                    "write" => Hold::Write,
                    other => {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!(
                                "unknown `hold` value {other:?}: use \"exclusive\" (the \
                                 default), \"fair\" (granted in arrival order), \"read\" \
                                 or \"write\" (a read-write lock)"
                            ),
                        ));
                    }
                };
                set_once(&mut args.hold, hold, "hold", span)?;
            } else if lookahead.peek(kw::client) {
                input.parse::<kw::client>()?;
                input.parse::<Token![=]>()?;
                set_once(&mut args.client, input.parse::<Expr>()?, "client", span)?;
            } else {
                return Err(syn::Error::new(
                    span,
                    format!("unknown argument `{name}`; expected one of: {ARGUMENTS}"),
                ));
            }
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        Ok(args)
    }
}

/// `key = a`, `key = a.b.0`, `key = (a, b.c)`.
fn parse_key(input: ParseStream<'_>) -> syn::Result<Vec<KeyPath>> {
    if input.peek(syn::token::Paren) {
        let content;
        syn::parenthesized!(content in input);
        let mut parts = Vec::new();
        while !content.is_empty() {
            parts.push(parse_path(&content)?);
            if !content.is_empty() {
                content.parse::<Token![,]>()?;
            }
        }
        if parts.is_empty() {
            return Err(content.error("`key` needs at least one argument"));
        }
        Ok(parts)
    } else {
        Ok(vec![parse_path(input)?])
    }
}

fn parse_path(input: ParseStream<'_>) -> syn::Result<KeyPath> {
    let root = input.call(Ident::parse_any)?;
    let mut tokens = root.to_token_stream();
    while input.peek(Token![.]) {
        input.parse::<Token![.]>()?.to_tokens(&mut tokens);
        if input.peek(LitInt) {
            input.parse::<LitInt>()?.to_tokens(&mut tokens);
        } else {
            input.call(Ident::parse_any)?.to_tokens(&mut tokens);
        }
    }
    Ok(KeyPath { root, tokens })
}

/// `"500ms"`, `"10s"`, `"2m"`, `"1h"`, or an integer of seconds.
fn parse_duration(input: ParseStream<'_>) -> syn::Result<Millis> {
    const HELP: &str = "use \"500ms\", \"10s\", \"2m\", \"1h\" or an integer of seconds";
    if input.peek(LitInt) {
        let lit: LitInt = input.parse()?;
        let secs: u64 = lit
            .base10_parse()
            .map_err(|_| syn::Error::new(lit.span(), format!("malformed duration: {HELP}")))?;
        return Ok(Millis {
            ms: secs.saturating_mul(1000),
            span: lit.span(),
        });
    }
    let lit: LitStr = input
        .parse()
        .map_err(|e| syn::Error::new(e.span(), format!("expected a duration: {HELP}")))?;
    let text = lit.value();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let factor = match unit {
        "ms" => Some(1),
        "s" => Some(1000),
        "m" => Some(60_000),
        "h" => Some(3_600_000),
        _ => None,
    };
    match (digits.parse::<u64>(), factor) {
        (Ok(n), Some(f)) => Ok(Millis {
            ms: n.saturating_mul(f),
            span: lit.span(),
        }),
        _ => Err(syn::Error::new(
            lit.span(),
            format!("malformed duration {text:?}: {HELP}"),
        )),
    }
}
