//! `#[ruststream::handler]`: checks a handler function where it is written.
//!
//! Used through the `ruststream` crate, which re-exports it. Without the attribute, a
//! handler with a mistake is refused where it is registered, with one message for every
//! kind of mistake ("is not a ruststream handler"). With it, each mistake is reported at
//! its cause: the argument that is not an extractor, the return type that is not an
//! outcome, the value that makes the future not `Send` and the `.await` it is held
//! across. The function itself is left exactly as written.

// No function over 80 lines of code (clippy.toml), in library code (ARCHITECTURE.md).
#![deny(clippy::too_many_lines)]

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as Tokens};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, ReturnType, parse_macro_input};

/// Most arguments a handler takes (the `Handler` impls go up to eight).
const MAX_ARGUMENTS: usize = 8;

/// Checks that an `async fn` is a ruststream handler: every argument an extractor
/// (`FromDelivery`), the return type an outcome (`IntoOutcome`), the future `Send`.
/// Each mistake is reported at the argument, type or `.await` that causes it; the
/// function is left unchanged and costs nothing at run time.
#[proc_macro_attribute]
pub fn handler(attribute: TokenStream, item: TokenStream) -> TokenStream {
    let function = parse_macro_input!(item as ItemFn);
    let checks = if attribute.is_empty() {
        checks(&function).unwrap_or_else(syn::Error::into_compile_error)
    } else {
        syn::Error::new(
            Tokens::from(attribute).span(),
            "`#[ruststream::handler]` takes no arguments",
        )
        .into_compile_error()
    };
    quote!(#function #checks).into()
}

fn checks(function: &ItemFn) -> syn::Result<Tokens> {
    let signature = &function.sig;
    if signature.asyncness.is_none() {
        return Err(syn::Error::new(
            signature.fn_token.span(),
            "a ruststream handler is an `async fn`",
        ));
    }
    if !signature.generics.params.is_empty() || signature.generics.where_clause.is_some() {
        return Err(syn::Error::new(
            signature.generics.span(),
            "`#[ruststream::handler]` checks a handler with concrete types; a generic handler is \
             checked where it is registered",
        ));
    }
    let mut types = Vec::new();
    for (index, input) in signature.inputs.iter().enumerate() {
        match input {
            FnArg::Receiver(receiver) => {
                return Err(syn::Error::new(
                    receiver.span(),
                    "a ruststream handler is a free function: it takes no `self`",
                ));
            }
            FnArg::Typed(typed) if index == MAX_ARGUMENTS => {
                return Err(syn::Error::new(
                    typed.span(),
                    format!("a ruststream handler takes at most {MAX_ARGUMENTS} arguments"),
                ));
            }
            FnArg::Typed(typed) => types.push(&*typed.ty),
        }
    }
    let name = &signature.ident;
    let extractors = types.iter().map(|ty| {
        quote_spanned! {ty.span()=> ::ruststream::__private::extractor::<#ty>(); }
    });
    let outcome = match &signature.output {
        ReturnType::Default => quote_spanned! {signature.ident.span()=>
            ::ruststream::__private::outcome::<()>();
        },
        ReturnType::Type(_, ty) => quote_spanned! {ty.span()=>
            ::ruststream::__private::outcome::<#ty>();
        },
    };
    let values: Vec<_> = (0..types.len())
        .map(|i| format_ident!("argument_{}", i, span = Span::mixed_site()))
        .collect();
    let check = format_ident!("__ruststream_check_{}", name, span = Span::mixed_site());
    let send = quote_spanned! {signature.fn_token.span()=>
        ::ruststream::__private::send(#name(#(#values),*));
    };
    Ok(quote! {
        #[doc(hidden)]
        #[allow(dead_code, non_snake_case, unused_variables, clippy::too_many_arguments)]
        fn #check(#(#values: #types),*) {
            #(#extractors)*
            #outcome
            #send
        }
    })
}
