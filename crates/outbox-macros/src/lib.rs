//! `#[derive(Event)]`: the constants of `outbox_core::event::Event` from an
//! attribute. Use it through the facade, `#[derive(outbox::Event)]` (feature
//! `derive`, on by default).
//!
//! ```text
//! #[derive(Serialize, Deserialize, outbox::Event)]
//! #[event(type = "order.created", exchange = "shop.orders")]
//! struct OrderCreated { order_id: u64 }
//! ```
//!
//! The keys of `#[event(..)]`:
//!
//! | key | | becomes |
//! |---|---|---|
//! | `type = "order.created"` | required | `Event::TYPE` |
//! | `exchange = "shop.orders"` | required (`""`: the default exchange) | `Event::EXCHANGE` |
//! | `version = 2` | optional, default 1 | `Event::VERSION` |
//! | `routing_key = "orders.new"` | optional, default the type | `Event::routing_key`, a fixed string |
//! | `crate = outbox_core` | optional, default `::outbox` | the path the trait is named by (`<path>::Event`) |
//!
//! The derive writes nothing else: an ordering key or a delay computed from the
//! value needs a plain `impl Event`, which is always possible instead.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;
use quote::quote;
use syn::meta::ParseNestedMeta;
use syn::{DeriveInput, LitInt, LitStr, Path, parse_macro_input};

/// AMQP short strings (exchange, routing key, type) are at most 255 bytes.
const MAX_SHORT_STRING: usize = 255;

/// Implements `Event` from `#[event(type = "..", exchange = "..", version = N,
/// routing_key = "..", crate = path)]`; see the crate's documentation.
#[proc_macro_derive(Event, attributes(event))]
pub fn derive_event(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// What `#[event(..)]` said.
#[derive(Default)]
struct Args {
    type_: Option<LitStr>,
    exchange: Option<LitStr>,
    version: Option<u32>,
    routing_key: Option<LitStr>,
    krate: Option<Path>,
}

impl Args {
    fn parse(&mut self, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
        let key = if meta.path.is_ident("type") {
            "type"
        } else if meta.path.is_ident("exchange") {
            "exchange"
        } else if meta.path.is_ident("version") {
            "version"
        } else if meta.path.is_ident("routing_key") {
            "routing_key"
        } else if meta.path.is_ident("crate") {
            "crate"
        } else {
            return Err(meta.error(
                "unknown key in #[event(..)]: expected `type`, `exchange`, `version`, `routing_key` or `crate`",
            ));
        };
        let duplicate = match key {
            "type" => self.type_.is_some(),
            "exchange" => self.exchange.is_some(),
            "version" => self.version.is_some(),
            "routing_key" => self.routing_key.is_some(),
            _ => self.krate.is_some(),
        };
        if duplicate {
            return Err(meta.error(format!("`{key}` is given twice")));
        }
        let value = meta.value()?;
        match key {
            "type" => self.type_ = Some(short_string(value.parse()?, "type", false)?),
            "exchange" => self.exchange = Some(short_string(value.parse()?, "exchange", true)?),
            "routing_key" => {
                self.routing_key = Some(short_string(value.parse()?, "routing_key", true)?);
            }
            "version" => self.version = Some(value.parse::<LitInt>()?.base10_parse::<u32>()?),
            _ => {
                // `crate = outbox_core` or, as serde spells it, `crate = "outbox_core"`.
                let path = if value.peek(LitStr) {
                    value.parse::<LitStr>()?.parse::<Path>()?
                } else {
                    value.parse::<Path>()?
                };
                self.krate = Some(path);
            }
        }
        Ok(())
    }
}

/// `lit` when it fits an AMQP short string (and is not empty, unless allowed).
fn short_string(lit: LitStr, key: &str, empty_ok: bool) -> syn::Result<LitStr> {
    let len = lit.value().len();
    if len == 0 && !empty_ok {
        return Err(syn::Error::new(lit.span(), format!("`{key}` is empty")));
    }
    if len > MAX_SHORT_STRING {
        return Err(syn::Error::new(
            lit.span(),
            format!("`{key}` is {len} bytes long; AMQP allows at most {MAX_SHORT_STRING}"),
        ));
    }
    Ok(lit)
}

fn expand(input: &DeriveInput) -> syn::Result<TokenStream2> {
    let mut args = Args::default();
    let mut errors: Option<syn::Error> = None;
    let mut seen = false;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("event")) {
        seen = true;
        if let Err(e) = attr.parse_nested_meta(|meta| args.parse(&meta)) {
            match &mut errors {
                Some(all) => all.combine(e),
                None => errors = Some(e),
            }
        }
    }
    if let Some(e) = errors {
        return Err(e);
    }
    let ident = &input.ident;
    let missing = |key: &str| {
        let hint = if seen {
            format!("#[derive(Event)] needs `{key} = \"...\"` in #[event(..)]")
        } else {
            "#[derive(Event)] needs #[event(type = \"...\", exchange = \"...\")]".to_owned()
        };
        syn::Error::new(ident.span(), hint)
    };
    let (type_, exchange) = match (args.type_, args.exchange) {
        (Some(t), Some(e)) => (t, e),
        (None, _) => return Err(missing("type")),
        (_, None) => return Err(missing("exchange")),
    };
    let krate = args
        .krate
        .map_or_else(|| quote!(::outbox), |path| quote!(#path));
    let version = args.version.map(|v| quote!(const VERSION: u32 = #v;));
    let routing_key = args.routing_key.map(|key| {
        quote! {
            fn routing_key(&self) -> ::std::borrow::Cow<'_, str> {
                ::std::borrow::Cow::Borrowed(#key)
            }
        }
    });
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    Ok(quote! {
        #[automatically_derived]
        impl #impl_generics #krate::Event for #ident #ty_generics #where_clause {
            const TYPE: &'static str = #type_;
            const EXCHANGE: &'static str = #exchange;
            #version
            #routing_key
        }
    })
}

#[cfg(test)]
mod tests {
    use super::expand;

    fn expanded(src: &str) -> Result<String, String> {
        let input: syn::DeriveInput = syn::parse_str(src).expect("a struct");
        expand(&input)
            .map(|t| t.to_string())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_constants_come_from_the_attribute() {
        let out = expanded(
            r#"#[event(type = "order.created", exchange = "shop.orders", version = 2, routing_key = "orders.new")]
               struct OrderCreated { order_id: u64 }"#,
        )
        .expect("valid");
        assert!(out.contains(":: outbox :: Event for OrderCreated"), "{out}");
        assert!(
            out.contains(r#"const TYPE : & 'static str = "order.created""#),
            "{out}"
        );
        assert!(
            out.contains(r#"const EXCHANGE : & 'static str = "shop.orders""#),
            "{out}"
        );
        assert!(out.contains("const VERSION : u32 = 2u32"), "{out}");
        assert!(out.contains(r#"Cow :: Borrowed ("orders.new")"#), "{out}");
    }

    #[test]
    fn optional_keys_leave_the_defaults_and_generics_are_kept() {
        let out = expanded(
            r#"#[event(exchange = "", type = "t")]
               struct Wrapped<T> where T: Clone { value: T }"#,
        )
        .expect("valid");
        assert!(!out.contains("VERSION"), "{out}");
        assert!(!out.contains("routing_key"), "{out}");
        assert!(
            out.contains("impl < T > :: outbox :: Event for Wrapped < T > where T : Clone"),
            "{out}"
        );
    }

    #[test]
    fn the_crate_path_can_be_overridden() {
        for krate in ["outbox_core", r#""outbox_core""#] {
            let out = expanded(&format!(
                r#"#[event(type = "t", exchange = "x", crate = {krate})] struct E;"#
            ))
            .expect("valid");
            assert!(out.contains("impl outbox_core :: Event for E"), "{out}");
        }
        let out = expanded(r#"#[event(crate = crate, type = "t", exchange = "x")] struct E;"#)
            .expect("valid");
        assert!(out.contains("impl crate :: Event for E"), "{out}");
    }

    #[test]
    fn missing_unknown_and_invalid_keys_are_errors() {
        let cases = [
            (
                "struct E;",
                r#"#[derive(Event)] needs #[event(type = "...", exchange = "...")]"#,
            ),
            (
                r#"#[event(exchange = "x")] struct E;"#,
                r#"#[derive(Event)] needs `type = "..."` in #[event(..)]"#,
            ),
            (
                r#"#[event(type = "t")] struct E;"#,
                r#"#[derive(Event)] needs `exchange = "..."` in #[event(..)]"#,
            ),
            (
                r#"#[event(type = "t", exchange = "x", ordering_key = "k")] struct E;"#,
                "unknown key in #[event(..)]: expected `type`, `exchange`, `version`, `routing_key` or `crate`",
            ),
            (
                r#"#[event(type = "t", type = "u", exchange = "x")] struct E;"#,
                "`type` is given twice",
            ),
            (
                r#"#[event(type = "", exchange = "x")] struct E;"#,
                "`type` is empty",
            ),
            (
                r#"#[event(type = "t", exchange = "x", version = -1)] struct E;"#,
                "invalid digit found in string",
            ),
            (
                r#"#[event(type = "t", exchange = "x", version = "2")] struct E;"#,
                "expected integer literal",
            ),
            (
                r#"#[event(type = 1, exchange = "x")] struct E;"#,
                "expected string literal",
            ),
        ];
        for (src, error) in cases {
            assert_eq!(expanded(src).expect_err(src), error, "{src}");
        }
        let long = "k".repeat(256);
        let err = expanded(&format!(
            r#"#[event(type = "t", exchange = "x", routing_key = "{long}")] struct E;"#
        ))
        .expect_err("too long");
        assert_eq!(
            err,
            "`routing_key` is 256 bytes long; AMQP allows at most 255"
        );
    }
}
