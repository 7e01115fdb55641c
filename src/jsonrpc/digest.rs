//! The digest of a call: what tells a call a client re-sends (after a cut,
//! or to a restarted proxy) from another call under the same id, and what a
//! resume token is bound to.
//!
//! It is the SHA-256 of the method and the canonical params: object keys
//! sorted, duplicates resolved to the last, numbers and strings written as
//! serde_json writes them, and `_meta` and a root `resumeToken` left out, so
//! key order, progress tokens and resume tokens do not change it. Digests are
//! kept in the log and inside tokens, so the canonical bytes must never
//! change: they are those of serde_json's `Value` (a map ordered by key)
//! serialized, which the tests check against. Read with borrowed keys and
//! strings, so a call costs an allocation per object and array in its
//! params instead of one per key and string as well.
//!
//! One input reads differently: with serde_json's `raw_value` feature, an
//! object whose first key is its private raw-value token is read by `Value`
//! as the JSON text its string holds. Such a call (only a crafted one sends
//! it) is digested through `Value`, as it always was.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};
use serde_json::Number;

/// SHA-256 (hex) of a request's method and canonical params; `None` for
/// what is not a JSON object with a string `method`.
pub fn params_digest(bytes: &[u8]) -> Option<Arc<str>> {
    #[derive(Deserialize)]
    struct Request<'a> {
        #[serde(borrow)]
        method: Cow<'a, str>,
        #[serde(default, borrow)]
        params: Canonical<'a>,
    }
    let mut request: Request<'_> = match serde_json::from_slice(bytes) {
        Ok(request) => request,
        Err(e) if e.to_string().starts_with(RAW_VALUE_TOKEN) => return through_value(bytes),
        Err(_) => return None,
    };
    if let Canonical::Object(members) = &mut request.params {
        members.retain(|(key, _)| key != "_meta" && key != "resumeToken");
    }
    let canonical = serde_json::to_vec(&(&*request.method, &request.params)).ok()?;
    Some(sha256_hex(&canonical))
}

/// The key by which serde_json (`raw_value`) marks an object as raw JSON
/// text (`serde_json::raw::TOKEN`, private to it).
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// The digest as it was first made, with the params read into a `Value`.
fn through_value(bytes: &[u8]) -> Option<Arc<str>> {
    #[derive(Deserialize)]
    struct Request {
        method: String,
        #[serde(default)]
        params: serde_json::Value,
    }
    let mut request: Request = serde_json::from_slice(bytes).ok()?;
    if let Some(params) = request.params.as_object_mut() {
        params.remove("_meta");
        params.remove("resumeToken");
    }
    // serde_json's map is ordered by key: serializing a parsed value is the
    // canonical form.
    let canonical = serde_json::to_vec(&(request.method, request.params)).ok()?;
    Some(sha256_hex(&canonical))
}

/// Shared from the start: the digest is kept by the stream and its copies.
fn sha256_hex(bytes: &[u8]) -> Arc<str> {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    Arc::from(crate::id::hex_into(digest.as_ref(), &mut [0; 64]))
}

/// A JSON value in canonical form: an object's members sorted by key, one
/// per key.
#[derive(Default)]
enum Canonical<'a> {
    /// Also what absent params count as.
    #[default]
    Null,
    Bool(bool),
    Number(Number),
    String(Cow<'a, str>),
    Array(Vec<Canonical<'a>>),
    Object(Vec<(Cow<'a, str>, Canonical<'a>)>),
}

/// An object key, borrowed from the input unless it holds escapes.
#[derive(Deserialize)]
struct Key<'a>(#[serde(borrow)] Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Canonical<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(CanonicalVisitor(std::marker::PhantomData))
    }
}

struct CanonicalVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for CanonicalVisitor<'a> {
    type Value = Canonical<'a>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Canonical::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Canonical::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Canonical::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Canonical::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        // As serde_json's `Value` does: a non-finite float (which JSON text
        // cannot hold) is null.
        Ok(Number::from_f64(v).map_or(Canonical::Null, Canonical::Number))
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Canonical::String(Cow::Borrowed(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Canonical::String(Cow::Owned(v.to_owned())))
    }

    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Canonical::String(Cow::Owned(v)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Canonical::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members: Vec<(Cow<'a, str>, Canonical<'a>)> = Vec::new();
        while let Some(Key(key)) = map.next_key()? {
            if members.is_empty() && key == RAW_VALUE_TOKEN {
                // Read otherwise by `Value`: the digest is made through it.
                return Err(serde::de::Error::custom(RAW_VALUE_TOKEN));
            }
            members.push((key, map.next_value()?));
        }
        // Of the members under one key the last read wins, as in a map:
        // reversed, the stable sort puts it first among them, and `dedup`
        // keeps the first.
        members.reverse();
        members.sort_by(|a, b| a.0.cmp(&b.0));
        members.dedup_by(|later, first| later.0 == first.0);
        Ok(Canonical::Object(members))
    }
}

impl Serialize for Canonical<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Canonical::Null => s.serialize_unit(),
            Canonical::Bool(b) => s.serialize_bool(*b),
            Canonical::Number(n) => n.serialize(s),
            Canonical::String(text) => s.serialize_str(text),
            Canonical::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Canonical::Object(members) => {
                let mut map = s.serialize_map(Some(members.len()))?;
                for (key, value) in members {
                    map.serialize_entry(key.as_ref(), value)?;
                }
                map.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn value_digest(bytes: &[u8]) -> Option<Arc<str>> {
        through_value(bytes)
    }

    fn same(text: &str) {
        assert_eq!(
            params_digest(text.as_bytes()),
            value_digest(text.as_bytes()),
            "{text}"
        );
    }

    #[test]
    fn digests_are_those_of_the_value_form_for_tricky_json() {
        same(r#"{"method":"m"}"#);
        same(r#"{"method":"m","params":null}"#);
        same(r#"{"method":"m","params":[1,"a",{"b":1,"a":2}]}"#);
        same(r#"{"method":"m","params":{"a":1,"a":2,"b":{"z":0,"y":[]}}}"#);
        same(
            r#"{"method":"m","params":{"n":[1.0,1e2,-0,-0.0,1E-7,12345678901234567890,-9223372036854775808]}}"#,
        );
        same(r#"{"method":"m","params":{"s":"\u0041\n\"\\\/\ud83d\ude00","\u00e9":1,"é":2}}"#);
        same(
            r#"{"method":"m\u0021","params":{"_meta":{"progressToken":1},"resumeToken":"t","x":{"_meta":1}}}"#,
        );
        same(r#"{"method":"m","params":"text"}"#);
        same(r#"{"method":1}"#);
        same(r#"not json"#);
        same(r#"{"method":"m","params":{"a":1}"#);
    }

    #[test]
    fn digests_are_those_of_the_value_form_for_numbers_out_of_range() {
        same(r#"{"method":"m","params":[18446744073709551616,-9223372036854775809]}"#);
        same(r#"{"method":"m","params":[1E+2,-12.50,0.1e-3,1e400]}"#);
    }

    #[test]
    fn digests_are_those_of_the_value_form_for_keys_that_need_escapes_or_sort_past_ascii() {
        same(r#"{"method":"m","params":{"\u0001":1,"\"":2,"é":3,"z":4,"~":5,"\u00ff":6}}"#);
        same(r#" { "method" : "m" , "params" : { "b" : [ 1 , 2 ] , "a" : { } } } "#);
    }

    #[test]
    fn digests_are_those_of_the_value_form_at_serde_json_s_depth_limit() {
        for depth in 125..=130 {
            let params = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            same(&format!(r#"{{"method":"m","params":{params}}}"#));
        }
    }

    #[test]
    fn the_raw_value_token_as_first_key_is_read_as_value_reads_it() {
        same(
            r#"{"method":"m","params":{"$serde_json::private::RawValue":"{\"b\":1,\"_meta\":2}"}}"#,
        );
        same(r#"{"method":"m","params":{"\u0024serde_json::private::RawValue":"[1]"}}"#);
        same(
            r#"{"method":"m","params":{"a":{"$serde_json::private::RawValue":"{\"z\":1,\"y\":2}"}}}"#,
        );
        same(r#"{"method":"m","params":{"$serde_json::private::RawValue":1}}"#);
        same(r#"{"method":"m","params":{"a":1,"$serde_json::private::RawValue":"[1]"}}"#);
    }

    /// Digests made before this module existed (at `f19d4dd`): kept in
    /// logs and bound into resume tokens, they must come out the same
    /// whatever serde_json version reads them.
    #[test]
    fn digests_made_by_earlier_releases_are_made_again() {
        let known = [
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"b":2,"a":1},"_meta":{"progressToken":"p"}}}"#,
                "db771fd2305283800982e9fcc70cb1053e90c3c9170f10f87d07a972b76e359f",
            ),
            (
                r#"{"method":"m"}"#,
                "f392d2630dfe9bc1eaac0393c68f4a226fafcf1e7b0ee8a24945e972ebca5542",
            ),
            (
                r#"{"method":"m","params":[1.5,"\u00e9"]}"#,
                "7ddcd143d2cd26e408b80549b9117df69bb591b1858ca0c1a72f182c145c5613",
            ),
        ];
        for (request, digest) in known {
            assert_eq!(
                params_digest(request.as_bytes()).as_deref(),
                Some(digest),
                "{request}"
            );
        }
    }

    /// JSON text as clients may write it: keys repeated, in any order,
    /// escaped or not; numbers in several notations.
    fn json() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_owned()),
            any::<bool>().prop_map(|b| b.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| format!("{f:e}")),
            (any::<i32>(), 1u8..4)
                .prop_map(|(n, zeros)| format!("{n}.{}", "0".repeat(zeros.into()))),
            any::<i128>().prop_map(|n| n.to_string()),
            "[a-c_é\\\\\"\u{1F600}]{0,4}".prop_map(|s| serde_json::Value::from(s).to_string()),
            Just(r#""\u0041\ud83d\ude00""#.to_owned()),
        ];
        leaf.prop_recursive(4, 32, 5, |inner| {
            let key = prop_oneof![
                "[ab_]{0,2}".prop_map(|k| format!("\"{k}\"")),
                Just(r#""\u0061""#.to_owned()),
                Just(r#""_meta""#.to_owned()),
                Just(r#""resumeToken""#.to_owned()),
                Just(r#""\u0001""#.to_owned()),
                Just(r#""\"""#.to_owned()),
                Just(r#""é""#.to_owned()),
            ];
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                prop::collection::vec((key, inner), 0..5).prop_map(|members| {
                    let members: Vec<String> =
                        members.iter().map(|(k, v)| format!("{k} : {v}")).collect();
                    format!("{{ {} }}", members.join(" ,"))
                }),
            ]
        })
    }

    proptest! {
        #[test]
        fn digests_are_those_of_the_value_form(params in json(), method in "[a-z/]{1,8}") {
            let request = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{method}","params":{params}}}"#);
            prop_assert_eq!(params_digest(request.as_bytes()), value_digest(request.as_bytes()), "{}", request);
        }
    }
}
