//! Property-based fuzzing of the parsers and sealers that take untrusted
//! input: the SSE decoder (upstream bytes), JSON-RPC classification (client
//! and upstream bodies), sealed handles (client-presented tokens) and the
//! config file.
//!
//! The default case counts keep the whole file well under 30 s in a debug
//! build. `FUZZ_CASES=<n>` runs every property `n` times instead (the long
//! mode, e.g. `FUZZ_CASES=1000000 cargo test --release --test fuzz`).

use std::sync::OnceLock;

use bytes::BytesMut;
use mcp_resume_proxy::config::Config;
use mcp_resume_proxy::id::{SessionId, StreamId};
use mcp_resume_proxy::jsonrpc::{self, Body, Kind, RequestId};
use mcp_resume_proxy::reply::sse::{self, Decoder, Event};
use mcp_resume_proxy::token::{CallToken, Keyring};
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{json, Value};

/// `FUZZ_CASES` if set (read once), else the property's default.
fn cases(default: u32) -> ProptestConfig {
    static FROM_ENV: OnceLock<Option<u32>> = OnceLock::new();
    let from_env = *FROM_ENV.get_or_init(|| {
        std::env::var("FUZZ_CASES")
            .ok()
            .map(|v| v.trim().parse().expect("FUZZ_CASES must be a number"))
    });
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(from_env.unwrap_or(default))
    }
}

// ---------------------------------------------------------------- SSE ----

fn decode_chunks<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> Vec<Event> {
    let mut decoder = Decoder::new();
    let mut events = Vec::new();
    for chunk in chunks {
        decoder.push(chunk);
        while let Some(event) = decoder.next_event() {
            events.push(event);
        }
    }
    events
}

/// Cuts `wire` at the given points (any order, duplicates allowed).
fn split<'a>(wire: &'a [u8], cuts: &[Index]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
    points.sort_unstable();
    let mut chunks = Vec::with_capacity(points.len() + 1);
    let mut start = 0;
    for p in points {
        chunks.push(&wire[start..p]);
        start = p;
    }
    chunks.push(&wire[start..]);
    chunks
}

/// Bytes that look like an event stream often enough to reach every branch
/// of the decoder: field names, colons, spaces and all three line ends, mixed
/// with anything at all.
fn sse_ish_bytes() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        3 => Just(b"data".to_vec()),
        2 => Just(b"id".to_vec()),
        1 => Just(b"event".to_vec()),
        1 => Just(b"retry".to_vec()),
        3 => Just(b":".to_vec()),
        2 => Just(b" ".to_vec()),
        3 => Just(b"\n".to_vec()),
        2 => Just(b"\r".to_vec()),
        2 => Just(b"\r\n".to_vec()),
        1 => Just(b"\0".to_vec()),
        1 => Just(b"12".to_vec()),
        3 => proptest::collection::vec(any::<u8>(), 0..8),
    ];
    proptest::collection::vec(token, 0..64).prop_map(|t| t.concat())
}

#[derive(Clone, Debug)]
enum Line {
    Data(Vec<u8>),
    Id(Vec<u8>),
    Event(Vec<u8>),
    Retry(Vec<u8>),
    Comment(Vec<u8>),
    Unknown(Vec<u8>),
    Blank,
}

/// A line's value: anything but a line end.
fn line_value() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        any::<u8>().prop_filter("no line end", |b| *b != b'\n' && *b != b'\r'),
        0..24,
    )
}

fn sse_line() -> impl Strategy<Value = Line> {
    prop_oneof![
        6 => line_value().prop_map(Line::Data),
        2 => line_value().prop_map(Line::Id),
        1 => line_value().prop_map(Line::Event),
        1 => line_value().prop_map(Line::Retry),
        1 => line_value().prop_map(Line::Comment),
        1 => line_value().prop_map(Line::Unknown),
        3 => Just(Line::Blank),
    ]
}

/// The wire bytes of `line` ended by `end`.
fn line_bytes(line: &Line, end: &[u8]) -> Vec<u8> {
    let field = |name: &[u8], value: &[u8]| [name, b": ", value, end].concat();
    match line {
        Line::Data(v) => field(b"data", v),
        Line::Id(v) => field(b"id", v),
        Line::Event(v) => field(b"event", v),
        Line::Retry(v) => field(b"retry", v),
        Line::Comment(v) => [b":", &v[..], end].concat(),
        // No colon and no known name: `x` followed by the value without colons.
        Line::Unknown(v) => {
            let v: Vec<u8> = v.iter().copied().filter(|b| *b != b':').collect();
            [b"x-", &v[..], end].concat()
        }
        Line::Blank => end.to_vec(),
    }
}

fn line_end() -> impl Strategy<Value = &'static [u8]> {
    prop_oneof![Just(&b"\n"[..]), Just(&b"\r\n"[..]), Just(&b"\r"[..])]
}

/// Ids the encoder may carry: no CR, LF or NUL (the decoder ignores an id
/// with NUL, and line ends would end the field). A leading space is eaten by
/// the decoder as the one optional space after the colon; the encoder writes
/// `id: ` so a leading space of the id itself survives.
fn sse_id() -> impl Strategy<Value = String> {
    "[^\r\n\u{0}]{0,40}"
}

proptest! {
    #![proptest_config(cases(5_000))]

    #[test]
    fn sse_decoder_never_panics_on_arbitrary_bytes(
        bytes in prop_oneof![proptest::collection::vec(any::<u8>(), 0..256), sse_ish_bytes()],
        cuts in proptest::collection::vec(any::<Index>(), 0..8),
    ) {
        let events = decode_chunks(split(&bytes, &cuts));
        // Every event came from at least a field line and a blank line.
        prop_assert!(events.len() <= bytes.len() / 2);
    }

    #[test]
    fn sse_decoding_is_independent_of_how_the_bytes_are_split(
        bytes in prop_oneof![sse_ish_bytes(), proptest::collection::vec(any::<u8>(), 0..256)],
        cuts in proptest::collection::vec(any::<Index>(), 0..16),
    ) {
        let whole = decode_chunks([&bytes[..]]);
        let pieces = decode_chunks(split(&bytes, &cuts));
        prop_assert_eq!(&whole, &pieces);
        let byte_by_byte = decode_chunks(bytes.chunks(1));
        prop_assert_eq!(&whole, &byte_by_byte);
    }

    /// `buffered()` is what the proxy checks against `MAX_MESSAGE` after
    /// draining the events of each chunk, so it must count everything the
    /// decoder holds for the event in progress (the partial line *and* the
    /// data lines of an event whose blank line has not come), and never more
    /// than was pushed since the last blank line.
    #[test]
    fn sse_buffered_counts_all_held_input_and_never_more_than_was_pushed(
        lines in proptest::collection::vec(sse_line(), 0..40),
        end in line_end(),
        cuts in proptest::collection::vec(any::<Index>(), 0..16),
    ) {
        let mut wire = Vec::new();
        // Per line: where it ends, whether it is blank, its data value length.
        let mut marks: Vec<(usize, bool, Option<usize>)> = Vec::new();
        for line in &lines {
            wire.extend_from_slice(&line_bytes(line, end));
            let data = match line { Line::Data(v) => Some(v.len()), _ => None };
            marks.push((wire.len(), matches!(line, Line::Blank), data));
        }
        let mut decoder = Decoder::new();
        let mut pushed = 0;
        for chunk in split(&wire, &cuts) {
            decoder.push(chunk);
            pushed += chunk.len();
            while decoder.next_event().is_some() {}
            // Lines complete in what was pushed; with CR line ends a line is
            // complete once its CR is in.
            let complete = marks
                .iter()
                .take_while(|(at, _, _)| *at + 1 - end.len() <= pushed);
            let mut since_blank = 0;
            let mut held_data = 0;
            let mut held_lines = 0;
            for (at, blank, data) in complete {
                if *blank {
                    since_blank = (*at).min(pushed);
                    held_data = 0;
                    held_lines = 0;
                } else if let Some(n) = data {
                    held_data += n;
                    held_lines += 1;
                }
            }
            let buffered = decoder.buffered();
            prop_assert!(
                buffered <= pushed - since_blank,
                "buffered {} > {} pushed since the last blank line", buffered, pushed - since_blank
            );
            prop_assert!(
                buffered >= held_data + held_lines,
                "buffered {} < {} bytes of {} held data lines", buffered, held_data, held_lines
            );
        }
    }

    #[test]
    fn sse_encoded_events_decode_to_the_same_id_and_data(
        events in proptest::collection::vec(
            (proptest::option::of(sse_id()), proptest::collection::vec(any::<u8>(), 0..128)),
            1..6,
        ),
        keep_alives in any::<bool>(),
        cuts in proptest::collection::vec(any::<Index>(), 0..8),
    ) {
        let mut wire = BytesMut::new();
        for (id, data) in &events {
            sse::encode_event(&mut wire, id.as_deref(), data);
            if keep_alives {
                wire.extend_from_slice(sse::KEEP_ALIVE);
            }
        }
        let decoded = decode_chunks(split(&wire, &cuts));
        prop_assert_eq!(decoded.len(), events.len());
        for ((id, data), got) in events.iter().zip(&decoded) {
            prop_assert_eq!(id, &got.id);
            // Line ends inside the payload come back as LF (documented).
            let expected = String::from_utf8_lossy(data)
                .into_owned(); // only for a readable message on failure
            let mut want = Vec::with_capacity(data.len());
            let mut i = 0;
            while i < data.len() {
                match data[i] {
                    b'\r' if data.get(i + 1) == Some(&b'\n') => { want.push(b'\n'); i += 2; }
                    b'\r' => { want.push(b'\n'); i += 1; }
                    b => { want.push(b); i += 1; }
                }
            }
            prop_assert_eq!(&want[..], &got.data[..], "payload {:?}", expected);
            prop_assert!(got.has_data);
            prop_assert_eq!(got.event.as_deref(), Some("message"));
        }
    }

    #[test]
    fn sse_priming_events_decode_to_their_id_and_retry(
        id in sse_id(),
        retry in proptest::option::of(any::<u64>()),
    ) {
        let mut wire = BytesMut::new();
        sse::encode_priming(&mut wire, &id, retry);
        let decoded = decode_chunks([&wire[..]]);
        prop_assert_eq!(decoded.len(), 1);
        prop_assert_eq!(decoded[0].id.as_deref(), Some(&id[..]));
        prop_assert_eq!(decoded[0].retry, retry);
        prop_assert!(decoded[0].has_data && decoded[0].data.is_empty());
    }
}

// ----------------------------------------------------------- JSON-RPC ----

/// Any JSON value, bounded in depth and size.
fn json_value() -> impl Strategy<Value = Value> + Clone {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from), // NaN and infinities become null
        ".{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("jsonrpc"),
            Just("2.0"),
            Just("id"),
            Just("method"),
            Just("params"),
            Just("result"),
            Just("error"),
            Just("_meta"),
            Just("progressToken"),
        ]
        .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(json_key(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Object keys: the ones the proxy looks at, often, and anything else.
fn json_key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop_oneof![
            Just("jsonrpc"), Just("id"), Just("method"), Just("params"), Just("result"),
            Just("error"), Just("_meta"), Just("progressToken"), Just("requestId"),
            Just("protocolVersion"), Just("resumeToken"), Just("progress"),
        ].prop_map(String::from),
        1 => ".{0,8}",
    ]
}

/// A JSON-RPC id as a value: a number or a string.
fn request_id() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        ".{0,16}".prop_map(Value::String),
    ]
}

fn method() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("tools/call".to_string()),
        Just("initialize".to_string()),
        Just("notifications/cancelled".to_string()),
        ".{0,24}",
    ]
}

/// A valid message, what it is, its id and method.
fn message() -> impl Strategy<Value = (Value, Kind, Option<Value>, Option<String>)> {
    let params = proptest::option::of(json_value());
    prop_oneof![
        (request_id(), method(), params.clone()).prop_map(|(id, m, p)| {
            let mut v = json!({"jsonrpc": "2.0", "id": id.clone(), "method": m.clone()});
            if let Some(p) = p {
                v["params"] = p;
            }
            (v, Kind::Request, Some(id), Some(m))
        }),
        (method(), params, any::<bool>()).prop_map(|(m, p, null_id)| {
            let mut v = json!({"jsonrpc": "2.0", "method": m.clone()});
            if let Some(p) = p {
                v["params"] = p;
            }
            if null_id {
                v["id"] = Value::Null;
            }
            (v, Kind::Notification, None, Some(m))
        }),
        (request_id(), json_value()).prop_map(|(id, result)| {
            let v = json!({"jsonrpc": "2.0", "id": id.clone(), "result": result});
            (v, Kind::Response, Some(id), None)
        }),
        (
            request_id(),
            any::<i64>(),
            ".{0,16}",
            proptest::option::of(json_value())
        )
            .prop_map(|(id, code, message, data)| {
                let mut error = json!({"code": code, "message": message});
                if let Some(d) = data {
                    error["data"] = d;
                }
                let v = json!({"jsonrpc": "2.0", "id": id.clone(), "error": error});
                (v, Kind::Response, Some(id), None)
            }),
    ]
}

/// Every byte-level helper of `jsonrpc`, for the never-panics properties.
fn exercise_jsonrpc(bytes: &[u8]) {
    let _ = jsonrpc::classify(bytes);
    let body = jsonrpc::parse_body(bytes);
    let _ = jsonrpc::response_ids(bytes);
    let _ = jsonrpc::protocol_version(bytes);
    let _ = jsonrpc::cancelled_request_ids(bytes);
    let _ = jsonrpc::progress_token(bytes);
    let _ = jsonrpc::progress_of(bytes);
    let _ = jsonrpc::resume_token(bytes);
    let _ = jsonrpc::params_digest(bytes);
    if let Ok(body) = &body {
        let _ = jsonrpc::request_progress_tokens(bytes, body);
    }
    for id in ["1", "\"x\"", "null"] {
        let _ = jsonrpc::with_id(bytes, &RequestId(id.into()));
    }
}

proptest! {
    #![proptest_config(cases(5_000))]

    #[test]
    fn jsonrpc_parsing_never_panics_on_arbitrary_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..128),
    ) {
        exercise_jsonrpc(&bytes);
    }

    #[test]
    fn jsonrpc_parsing_never_panics_on_arbitrary_json(value in json_value()) {
        let bytes = serde_json::to_vec(&value).unwrap();
        exercise_jsonrpc(&bytes);
        let pretty = serde_json::to_vec_pretty(&value).unwrap();
        exercise_jsonrpc(&pretty);
    }

    #[test]
    fn valid_jsonrpc_messages_classify_as_what_they_are(
        (value, kind, id, method) in message(),
        pretty in any::<bool>(),
    ) {
        let bytes = if pretty {
            serde_json::to_vec_pretty(&value).unwrap()
        } else {
            serde_json::to_vec(&value).unwrap()
        };
        let envelope = jsonrpc::classify(&bytes)
            .map_err(|e| TestCaseError::fail(format!("{e} for {value}")))?;
        prop_assert_eq!(envelope.kind, kind);
        prop_assert_eq!(&envelope.method, &method);
        prop_assert_eq!(envelope.error, value.get("error").is_some());
        let id = id.map(|id| RequestId(serde_json::to_string(&id).unwrap().into()));
        prop_assert_eq!(&envelope.id, &id);
        let body = jsonrpc::parse_body(&bytes).unwrap();
        prop_assert_eq!(body, Body::Single(envelope.clone()));
        if kind == Kind::Response {
            prop_assert_eq!(jsonrpc::response_ids(&bytes), id.into_iter().collect::<Vec<_>>());
        }
    }

    #[test]
    fn a_batch_of_valid_messages_classifies_message_by_message(
        messages in proptest::collection::vec(message(), 1..6),
    ) {
        let batch = Value::Array(messages.iter().map(|m| m.0.clone()).collect());
        let bytes = serde_json::to_vec(&batch).unwrap();
        let body = jsonrpc::parse_body(&bytes)
            .map_err(|e| TestCaseError::fail(format!("{e} for {batch}")))?;
        let Body::Batch(envelopes) = body else {
            return Err(TestCaseError::fail("not a batch"));
        };
        prop_assert_eq!(envelopes.len(), messages.len());
        for (envelope, (_, kind, _, _)) in envelopes.iter().zip(&messages) {
            prop_assert_eq!(envelope.kind, *kind);
        }
    }
}

// ------------------------------------------------------ sealed handles ----

const KINDS: usize = 5;

/// Seals one handle of kind `k` (0..5).
#[allow(clippy::too_many_arguments)]
fn seal(
    keys: &Keyring,
    k: usize,
    session: SessionId,
    principal: &str,
    digest: &[u8],
    stream: StreamId,
    seq: u64,
    expires: u64,
) -> String {
    let mut position = [0u8; 24];
    position[..16].copy_from_slice(stream.as_bytes());
    position[16..].copy_from_slice(&seq.to_be_bytes());
    match k {
        0 => keys.event_id(session, stream, seq),
        1 => keys.resume_token(session, principal, stream),
        2 => keys.stream_handle(session, principal, stream),
        3 => keys.poll_cursor(session, principal, &position),
        _ => keys.call_token(
            session,
            principal,
            digest,
            &CallToken {
                stream,
                cursor: seq,
                expires_ms: expires,
            },
        ),
    }
}

/// Opens `text` as kind `k`; `Some` with what it names, in one shape for all
/// kinds: (stream bytes, seq, expiry).
fn open(
    keys: &Keyring,
    k: usize,
    session: SessionId,
    principal: &str,
    digest: &[u8],
    text: &str,
) -> Option<([u8; 16], u64, u64)> {
    match k {
        0 => keys
            .open_event_id(session, text)
            .map(|(s, seq)| (s.0, seq, 0)),
        1 => keys
            .open_resume_token(session, principal, text)
            .map(|s| (s.0, 0, 0)),
        2 => keys
            .open_stream_handle(session, principal, text)
            .map(|s| (s.0, 0, 0)),
        3 => keys.open_poll_cursor(session, principal, text).map(|p| {
            let stream: [u8; 16] = p[..16].try_into().unwrap();
            (stream, u64::from_be_bytes(p[16..].try_into().unwrap()), 0)
        }),
        _ => keys
            .open_call_token(session, principal, digest, text)
            .map(|t| (t.stream.0, t.cursor, t.expires_ms)),
    }
}

/// What kind `k` is expected to give back for the sealed inputs.
fn named(k: usize, stream: StreamId, seq: u64, expires: u64) -> ([u8; 16], u64, u64) {
    match k {
        0 | 3 => (stream.0, seq, 0),
        1 | 2 => (stream.0, 0, 0),
        _ => (stream.0, seq, expires),
    }
}

/// Principals and params digests are hex digests in the proxy; the call
/// token's binding separates them with a NUL, so they never contain one.
fn principal() -> impl Strategy<Value = String> {
    prop_oneof!["[0-9a-f]{0,64}", "[^\u{0}]{0,24}"]
}

#[derive(Debug, Clone)]
struct Sealed {
    secret: Vec<u8>,
    kind: usize,
    session: [u8; 16],
    principal: String,
    digest: String,
    stream: [u8; 16],
    seq: u64,
    expires: u64,
}

fn sealed() -> impl Strategy<Value = Sealed> {
    (
        proptest::collection::vec(any::<u8>(), 0..48),
        0..KINDS,
        any::<[u8; 16]>(),
        principal(),
        principal(),
        any::<[u8; 16]>(),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(
            |(secret, kind, session, principal, digest, stream, seq, expires)| Sealed {
                secret,
                kind,
                session,
                principal,
                digest,
                stream,
                seq,
                expires,
            },
        )
}

impl Sealed {
    fn keys(&self) -> Keyring {
        Keyring::from_secret(&self.secret)
    }

    fn text(&self, keys: &Keyring) -> String {
        seal(
            keys,
            self.kind,
            SessionId(self.session),
            &self.principal,
            self.digest.as_bytes(),
            StreamId(self.stream),
            self.seq,
            self.expires,
        )
    }

    fn open_as(&self, keys: &Keyring, kind: usize, text: &str) -> Option<([u8; 16], u64, u64)> {
        open(
            keys,
            kind,
            SessionId(self.session),
            &self.principal,
            self.digest.as_bytes(),
            text,
        )
    }
}

const BASE64URL: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

proptest! {
    #![proptest_config(cases(2_000))]

    #[test]
    fn arbitrary_text_never_opens_as_any_handle(
        secret in proptest::collection::vec(any::<u8>(), 0..48),
        text in prop_oneof![
            ".{0,80}",
            "[A-Za-z0-9_-]{30,60}",
            "[ \t]{0,8}[A-Za-z0-9_-]{48,56}[ \t]{0,8}",
        ],
        session in any::<[u8; 16]>(),
        principal in principal(),
    ) {
        let keys = Keyring::from_secret(&secret);
        for k in 0..KINDS {
            prop_assert_eq!(open(&keys, k, SessionId(session), &principal, b"", &text), None);
        }
    }

    /// Text that gets past every check but the MAC: the right length, kind
    /// byte and key id, with a random tag and body.
    #[test]
    fn well_formed_but_forged_handles_never_open(
        s in sealed(),
        forged in proptest::collection::vec(any::<u8>(), 12 + 32),
    ) {
        use base64::Engine;
        let keys = s.keys();
        let genuine = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s.text(&keys))
            .unwrap();
        let mut raw = genuine[..2].to_vec();
        raw.extend_from_slice(&forged[..genuine.len() - 2]);
        prop_assume!(raw != genuine);
        let text = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&raw);
        prop_assert_eq!(s.open_as(&keys, s.kind, &text), None);
    }

    #[test]
    fn a_sealed_handle_opens_to_what_it_names(s in sealed(), pad in "[ \t]{0,3}") {
        let keys = s.keys();
        let text = s.text(&keys);
        prop_assert!(text.bytes().all(|b| BASE64URL.contains(&b)), "{}", text);
        let want = Some(named(s.kind, StreamId(s.stream), s.seq, s.expires));
        prop_assert_eq!(s.open_as(&keys, s.kind, &text), want);
        // Sealing is deterministic, and whitespace around a header value is
        // forgiven.
        prop_assert_eq!(&s.text(&keys), &text);
        let padded = format!("{pad}{text}{pad}");
        prop_assert_eq!(s.open_as(&keys, s.kind, &padded), want);
    }

    #[test]
    fn a_handle_with_any_one_character_changed_never_opens(
        s in sealed(),
        at in any::<Index>(),
        to in prop_oneof![
            4 => proptest::sample::select(BASE64URL).prop_map(char::from),
            1 => any::<char>(),
        ],
    ) {
        let keys = s.keys();
        let text = s.text(&keys);
        let at = at.index(text.len());
        prop_assume!(text.as_bytes()[at] != to as u32 as u8 || !to.is_ascii());
        let mut edited = String::with_capacity(text.len() + 4);
        edited.push_str(&text[..at]);
        edited.push(to);
        edited.push_str(&text[at + 1..]);
        prop_assert_ne!(&edited, &text);
        for k in 0..KINDS {
            prop_assert_eq!(s.open_as(&keys, k, &edited), None, "{} opened as kind {}", edited, k);
        }
    }

    #[test]
    fn a_handle_opens_as_no_other_kind_session_principal_or_key(
        s in sealed(),
        other_session in any::<[u8; 16]>(),
        other_principal in principal(),
        other_digest in principal(),
        other_secret in proptest::collection::vec(any::<u8>(), 0..48),
    ) {
        let keys = s.keys();
        let text = s.text(&keys);
        for k in (0..KINDS).filter(|k| *k != s.kind) {
            prop_assert_eq!(s.open_as(&keys, k, &text), None, "opened as kind {}", k);
        }
        if other_session != s.session {
            let moved = Sealed { session: other_session, ..s.clone() };
            prop_assert_eq!(moved.open_as(&keys, s.kind, &text), None);
        }
        // Event ids are bound to the session only.
        if other_principal != s.principal && s.kind != 0 {
            let other = Sealed { principal: other_principal, ..s.clone() };
            prop_assert_eq!(other.open_as(&keys, s.kind, &text), None);
        }
        if other_digest != s.digest && s.kind == 4 {
            let other = Sealed { digest: other_digest, ..s.clone() };
            prop_assert_eq!(other.open_as(&keys, s.kind, &text), None);
        }
        // HMAC pads keys of up to one block (64 bytes) with zeros, so secrets
        // that differ only in trailing zeros are one key.
        let trim = |k: &[u8]| k.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
        if other_secret[..trim(&other_secret)] != s.secret[..trim(&s.secret)] {
            let other_keys = Keyring::from_secret(&other_secret);
            prop_assert_eq!(s.open_as(&other_keys, s.kind, &text), None);
        }
    }
}

// ------------------------------------------------------------- config ----

/// Values that are often the right type for some real key, and sometimes
/// the wrong one.
fn toml_scalar() -> impl Strategy<Value = toml::Value> {
    use toml::Value as V;
    prop_oneof![
        any::<i64>().prop_map(V::Integer),
        prop_oneof![
            Just(0i64),
            Just(1),
            Just(999),
            Just(1000),
            Just(1024),
            Just(8192),
            Just(-1),
            Just(i64::MAX),
            Just(u32::MAX as i64 + 1)
        ]
        .prop_map(V::Integer),
        any::<bool>().prop_map(V::Boolean),
        any::<f64>().prop_map(V::Float),
        prop_oneof![
            Just("127.0.0.1:0"),
            Just("[::1]:8080"),
            Just("0.0.0.0:65535"),
            Just("localhost:80"),
            Just("http://127.0.0.1:3000/mcp"),
            Just("https://a/"),
            Just("ftp://x"),
            Just("http://"),
            Just("/mcp"),
            Just("/"),
            Just("/healthz"),
            Just("/metrics"),
            Just("/metrics/"),
            Just(""),
            Just("batch"),
            Just("always"),
            Just("sled"),
            Just("journal"),
            Just("json"),
            Just("text"),
            Just("off"),
            Just("auto"),
            Just("authorization"),
            Just("bad header"),
            Just("*"),
        ]
        .prop_map(|s| V::String(s.into())),
        ".{0,16}".prop_map(V::String),
    ]
}

fn toml_value(depth: u32) -> BoxedStrategy<toml::Value> {
    if depth == 0 {
        return toml_scalar().boxed();
    }
    prop_oneof![
        6 => toml_scalar(),
        1 => proptest::collection::vec(toml_scalar(), 0..4).prop_map(toml::Value::Array),
        1 => toml_table(depth - 1).prop_map(toml::Value::Table),
    ]
    .boxed()
}

/// Every key name the config knows, at any level, and a few it does not.
const CONFIG_KEYS: &[&str] = &[
    "listen",
    "data_dir",
    "log_format",
    "max_body",
    "allowed_origins",
    "allowed_hosts",
    "principal_header",
    "shutdown_grace_secs",
    "metrics",
    "sse",
    "store",
    "limits",
    "dialects",
    "tokens",
    "tls",
    "upstream",
    "retry_ms",
    "keepalive_secs",
    "backend",
    "sync",
    "retention_secs",
    "session_idle_secs",
    "sweep_secs",
    "stream_max_entries",
    "stream_max_bytes",
    "max_header_bytes",
    "header_read_timeout_ms",
    "body_read_timeout_ms",
    "resumable_requests",
    "streams",
    "resume_tokens",
    "enabled",
    "min_wait_ms",
    "max_wait_ms",
    "min_ms",
    "max_ms",
    "mode",
    "interim_after_ms",
    "placement",
    "tools",
    "idle_expiry_ms",
    "final_grace_ms",
    "key_file",
    "previous_key_file",
    "previous_key_window_secs",
    "cert",
    "key",
    "client_ca",
    "path",
    "url",
    "command",
    "env",
    "cwd",
    "kill_grace_secs",
    "max_children",
    "answer_wait_ms",
    "connect_timeout_secs",
    "resume_attempts",
    "idle_timeout_ms",
    "request_timeout_ms",
    "ca_file",
    "unknown",
    "",
];

fn toml_table(depth: u32) -> BoxedStrategy<toml::Table> {
    let key = prop_oneof![
        8 => proptest::sample::select(CONFIG_KEYS).prop_map(String::from),
        1 => ".{0,6}",
    ];
    proptest::collection::btree_map(key, toml_value(depth), 0..6)
        .prop_map(|m| m.into_iter().collect())
        .boxed()
}

/// A config document: top-level keys, sections with their real names, and
/// `[[upstream]]` tables that mostly carry a `url` or a `command`.
fn config_table() -> impl Strategy<Value = toml::Table> {
    let upstream = (
        toml_table(1),
        prop_oneof![
            Just(Some((
                "url",
                toml::Value::String("http://127.0.0.1:3000/mcp".into())
            ))),
            toml_scalar().prop_map(|v| Some(("url", v))),
            Just(Some((
                "command",
                toml::Value::Array(vec![toml::Value::String("srv".into())])
            ))),
            Just(None),
        ],
    )
        .prop_map(|(mut t, main)| {
            if let Some((k, v)) = main {
                t.insert(k.into(), v);
            }
            toml::Value::Table(t)
        });
    (
        toml_table(2),
        proptest::collection::btree_map(
            proptest::sample::select(&["sse", "store", "limits", "dialects", "tokens", "tls"][..]),
            toml_table(1),
            0..4,
        ),
        proptest::collection::vec(upstream, 0..3),
    )
        .prop_map(|(mut top, sections, upstreams)| {
            for (name, t) in sections {
                top.insert(name.into(), toml::Value::Table(t));
            }
            if !upstreams.is_empty() {
                top.insert("upstream".into(), toml::Value::Array(upstreams));
            }
            top
        })
}

proptest! {
    #![proptest_config(cases(2_000))]

    #[test]
    fn config_parsing_never_panics_on_arbitrary_text(
        text in prop_oneof![
            ".{0,200}",
            "(\\[\\[upstream\\]\\]\n|\\[(store|limits|sse)\\]\n|(listen|data_dir|url|max_body|sync) = (\"[^\"]{0,12}\"|[0-9-]{1,20}|true)\n){0,8}",
        ],
    ) {
        if let Ok(config) = Config::from_toml(&text) {
            prop_assert!(config.validate().is_ok());
        }
        if let Ok(config) = toml::from_str::<Config>(&text) {
            let _ = config.validate();
        }
    }

    #[test]
    fn config_parsing_and_validation_never_panic_on_arbitrary_toml(table in config_table()) {
        let text = toml::to_string(&table).unwrap();
        let parsed = Config::from_toml(&text);
        let unvalidated = toml::from_str::<Config>(&text);
        match (&parsed, &unvalidated) {
            (Ok(config), Ok(same)) => {
                prop_assert_eq!(config, same);
                prop_assert!(config.validate().is_ok());
            }
            (Ok(_), Err(e)) => return Err(TestCaseError::fail(format!("only from_toml parsed: {e}"))),
            (Err(_), Ok(config)) => prop_assert!(config.validate().is_err()),
            (Err(_), Err(_)) => {}
        }
    }
}

/// The strategy is worth something only if it reaches valid configs too.
#[test]
fn the_config_strategy_reaches_valid_configs() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = config_table();
    let valid = (0..500)
        .filter(|_| {
            let table = strategy.new_tree(&mut runner).unwrap().current();
            Config::from_toml(&toml::to_string(&table).unwrap()).is_ok()
        })
        .count();
    assert!(valid > 0, "no valid config in 500 samples");
}

// -------------------------------------------- regressions found above ----

/// An upstream that never sends the blank line must still run into the
/// proxy's `MAX_MESSAGE` check on `buffered()`, even with empty data lines.
#[test]
fn data_lines_of_an_unfinished_sse_event_count_as_buffered() {
    let mut decoder = Decoder::new();
    for _ in 0..1000 {
        decoder.push(b"data:\n");
        assert!(decoder.next_event().is_none());
    }
    assert_eq!(decoder.buffered(), 1000 * 6);
    decoder.push(b"data: xyz\n");
    assert_eq!(decoder.buffered(), 1000 * 6 + 10);
    decoder.push(b"\n");
    assert_eq!(decoder.next_event().unwrap().data.len(), 1000 + 3);
    assert_eq!(decoder.buffered(), 0);
}

/// JSON-RPC 2.0 allows any value as a result, null included.
#[test]
fn a_response_with_a_null_result_is_a_response() {
    let bytes = br#"{"jsonrpc":"2.0","id":7,"result":null}"#;
    let envelope = jsonrpc::classify(bytes).unwrap();
    assert_eq!(envelope.kind, Kind::Response);
    assert!(!envelope.error);
    assert_eq!(jsonrpc::response_ids(bytes), vec![RequestId("7".into())]);
}
