//! Property-based fuzzing of the parsers and sealers that take untrusted
//! input, and regressions it found.

use mcp_resume_proxy::jsonrpc::{self, Kind, RequestId};
use mcp_resume_proxy::sse::Decoder;

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
