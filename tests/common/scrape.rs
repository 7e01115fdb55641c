//! Reading the proxy's `GET /metrics` page.

use http::StatusCode;

use super::{body_bytes, Call, McpClient};

/// The metrics page of the proxy `client` talks to (its `/mcp` replaced
/// by `/metrics`), checked to be OpenMetrics text.
pub async fn scrape(client: &McpClient) -> String {
    let url = client.url.trim_end_matches("/mcp").to_owned() + "/metrics";
    let res = McpClient::new(url).send(Call::get()).await;
    assert_eq!(res.status(), StatusCode::OK);
    let content_type = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    String::from_utf8(body_bytes(res).await.to_vec()).expect("metrics are UTF-8")
}

/// The value of the sample `series` (name with labels, as printed).
pub fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        })
        .unwrap_or_else(|| panic!("no sample {series} in\n{text}"))
}
