//! Code generation for `#[cache_lock]`.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, Pat, ReturnType, Type};

use crate::attr::{Args, Hold};

pub(crate) fn expand(args: Args, func: ItemFn) -> syn::Result<TokenStream> {
    let mut errors: Vec<syn::Error> = Vec::new();
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span(),
            "#[cache_lock] goes on an `async fn`: the lock is taken and released around an \
             await of the body",
        ));
    }
    let ret_ty = match &sig.output {
        ReturnType::Type(_, ty) if is_result(ty) => Some(ty.as_ref().clone()),
        ReturnType::Type(_, ty) => {
            errors.push(not_result(ty.span()));
            None
        }
        ReturnType::Default => {
            errors.push(not_result(sig.paren_token.span.close()));
            None
        }
    };
    let prefix = match &args.prefix {
        Some(p) => Some(p.clone()),
        None => {
            errors.push(syn::Error::new(
                Span::call_site(),
                "#[cache_lock] needs `prefix = \"...\"`: the first part of every lock key",
            ));
            None
        }
    };
    let bindings = bindings(sig.inputs.iter());
    let parts: Vec<TokenStream> = args.key.as_deref().unwrap_or_default().iter().map(|p| {
        if !bindings.contains(&p.root) {
            errors.push(syn::Error::new(
                p.root.span(),
                format!(
                    "`key` names `{}`, which is not an argument or binding of `{}`",
                    p.root, sig.ident
                ),
            ));
        }
        let t = &p.tokens;
        quote_spanned!(p.root.span()=> &#t as &(dyn ::lock_core::__private::KeyPart + ::core::marker::Sync))
    }).collect();
    if let (Some((true, span)), None) = (&args.release, &args.expire) {
        errors.push(syn::Error::new(
            *span,
            "`release = \"on_expiry\"` keeps the lock until its lease runs out: give it \
             `expire = \"...\"`",
        ));
    }
    if let Some(first) = errors.into_iter().reduce(|mut a, b| {
        a.combine(b);
        a
    }) {
        return Err(first);
    }
    let (Some(ret_ty), Some(prefix)) = (ret_ty, prefix) else {
        return Err(syn::Error::new(
            Span::call_site(),
            "#[cache_lock]: bad arguments",
        ));
    };

    // A type error converting LockError points at the user's return type.
    let err_conv = quote_spanned! {ret_ty.span()=>
        ::lock_core::__private::Result::Err(::lock_core::__private::lock_error(__cache_lock_error))
    };
    let client = match &args.client {
        Some(expr) => quote!(&(#expr)),
        None => quote! {
            match ::lock_core::__private::global_client() {
                ::lock_core::__private::Result::Ok(c) => c,
                ::lock_core::__private::Result::Err(__cache_lock_error) => return #err_conv,
            }
        },
    };
    let delimiter = args.delimiter.as_ref().map_or_else(
        || quote!(::core::option::Option::None),
        |d| quote!(::core::option::Option::Some(#d)),
    );
    let lease = match &args.expire {
        Some(m) => {
            let ms = m.ms;
            quote!(::core::option::Option::Some(::core::time::Duration::from_millis(#ms)))
        }
        None => quote!(::core::option::Option::None),
    };
    let wait_ms = args.wait.as_ref().map_or(0, |m| m.ms);
    let mode = match args.hold.unwrap_or(Hold::Exclusive) {
        Hold::Exclusive => quote!((::lock_core::LockMode::Exclusive, false)),
        Hold::Fair => quote!((::lock_core::LockMode::Exclusive, true)),
        Hold::Read => quote!((::lock_core::LockMode::Read, false)),
        Hold::Write => quote!((::lock_core::LockMode::Write, false)),
    };
    let keep = matches!(args.release, Some((true, _)));
    let block = &func.block;
    let body_ty = without_impl_trait(&ret_ty);
    // syn hands the body's inner attributes (`#![allow(..)]`, `//!` docs) over with the
    // fn's own: they go back inside.
    let (inner, attrs): (Vec<_>, Vec<_>) = func
        .attrs
        .iter()
        .partition(|a| matches!(a.style, syn::AttrStyle::Inner(_)));
    let vis = &func.vis;
    let body = quote! {
        ::lock_core::__private::scoped(async move {
            let __cache_lock_client = #client;
            let __cache_lock_guard = match ::lock_core::__private::acquire(
                __cache_lock_client,
                #prefix,
                #delimiter,
                &[#(#parts),*],
                #lease,
                ::core::time::Duration::from_millis(#wait_ms),
                #mode,
                #keep,
            )
            .await
            {
                ::lock_core::__private::Result::Ok(g) => g,
                ::lock_core::__private::Result::Err(__cache_lock_error) => return #err_conv,
            };
            let __cache_lock_result =
                ::lock_core::__private::typed::<#body_ty, _>(async move #block).await;
            ::lock_core::__private::finish(__cache_lock_guard).await;
            __cache_lock_result
        })
        .await
    };
    Ok(quote! {
        #(#attrs)*
        #vis #sig {
            #(#inner)*
            #body
        }
    })
}

fn not_result(span: Span) -> syn::Error {
    syn::Error::new(
        span,
        "#[cache_lock] needs a return type `Result<_, E>` with `E: From<lock_core::LockError>`, \
         so that a busy lock can be returned as an error",
    )
}

/// `Result<..>`, `io::Result<..>`, `anyhow::Result<..>`, an alias such as
/// `ApiResult<..>`: any path whose last name ends in `Result`.
fn is_result(ty: &Type) -> bool {
    match ty {
        Type::Path(p) => p
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident.to_string().ends_with("Result")),
        Type::Group(g) => is_result(&g.elem),
        Type::Paren(p) => is_result(&p.elem),
        _ => false,
    }
}

/// Every name an argument binds: `self`, plain arguments, and the bindings inside
/// destructuring patterns such as `State(app)` or `Path((a, b))`.
fn bindings<'a>(inputs: impl Iterator<Item = &'a FnArg>) -> Vec<syn::Ident> {
    let mut out = Vec::new();
    for arg in inputs {
        match arg {
            FnArg::Receiver(r) => out.push(syn::Ident::new("self", r.self_token.span)),
            FnArg::Typed(t) => pat_bindings(&t.pat, &mut out),
        }
    }
    out
}

fn pat_bindings(pat: &Pat, out: &mut Vec<syn::Ident>) {
    match pat {
        Pat::Ident(i) => {
            out.push(i.ident.clone());
            if let Some((_, sub)) = &i.subpat {
                pat_bindings(sub, out);
            }
        }
        Pat::Tuple(t) => t.elems.iter().for_each(|p| pat_bindings(p, out)),
        Pat::TupleStruct(t) => t.elems.iter().for_each(|p| pat_bindings(p, out)),
        Pat::Struct(s) => s.fields.iter().for_each(|f| pat_bindings(&f.pat, out)),
        Pat::Slice(s) => s.elems.iter().for_each(|p| pat_bindings(p, out)),
        Pat::Reference(r) => pat_bindings(&r.pat, out),
        Pat::Type(t) => pat_bindings(&t.pat, out),
        Pat::Paren(p) => pat_bindings(&p.pat, out),
        _ => {}
    }
}

/// `ty` with every `impl Trait` in it made `_`: the body's output type is written in a
/// turbofish, where an opaque type cannot be named, and the compiler infers it there.
fn without_impl_trait(ty: &Type) -> Type {
    let mut ty = ty.clone();
    infer_impl_trait(&mut ty);
    ty
}

fn infer_impl_trait(ty: &mut Type) {
    match ty {
        Type::ImplTrait(it) => {
            *ty = Type::Infer(syn::TypeInfer {
                attrs: Vec::new(),
                underscore_token: syn::Token![_](it.impl_token.span),
            })
        }
        Type::Path(p) => {
            if let Some(q) = &mut p.qself {
                infer_impl_trait(&mut q.ty);
            }
            for segment in &mut p.path.segments {
                if let syn::PathArguments::AngleBracketed(args) = &mut segment.arguments {
                    for arg in &mut args.args {
                        if let syn::GenericArgument::Type(t) = arg {
                            infer_impl_trait(t);
                        }
                    }
                }
            }
        }
        Type::Tuple(t) => t.elems.iter_mut().for_each(infer_impl_trait),
        Type::Reference(r) => infer_impl_trait(&mut r.elem),
        Type::Array(a) => infer_impl_trait(&mut a.elem),
        Type::Slice(s) => infer_impl_trait(&mut s.elem),
        Type::Paren(p) => infer_impl_trait(&mut p.elem),
        Type::Group(g) => infer_impl_trait(&mut g.elem),
        Type::Ptr(p) => infer_impl_trait(&mut p.elem),
        _ => {}
    }
}
