//! `[tracing]`: where OpenTelemetry traces go, as plain data with its
//! defaults, the standard `OTEL_*` variables it falls back on, and its
//! validation (messages that name the key or the variable).
//!
//! Nothing here starts an exporter or reads the environment by itself: the
//! command line hands the variables in ([`TracingConfig::with_env`]), so a
//! configuration built in code (an embedding, a test) is what it says.
//! `proxy.toml.example` documents every key and must change with this file.

use serde::Deserialize;

use crate::config::ConfigError;

/// The OTLP/HTTP path of traces under a base endpoint (OTLP specification).
pub const TRACES_PATH: &str = "/v1/traces";

pub const OTEL_EXPORTER_OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
pub const OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
pub const OTEL_SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
pub const OTEL_EXPORTER_OTLP_HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";
pub const OTEL_EXPORTER_OTLP_TRACES_HEADERS: &str = "OTEL_EXPORTER_OTLP_TRACES_HEADERS";

/// The service name spans carry when neither the file nor the environment
/// names one.
pub const DEFAULT_SERVICE_NAME: &str = "mcp-resume-proxy";

/// `[tracing]`: off until an endpoint is known.
#[derive(Clone, Debug, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// The OTLP/HTTP base URL (`http://collector:4318`); spans are POSTed
    /// to it with `/v1/traces` appended.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of every span. Unset: `OTEL_SERVICE_NAME`, else
    /// [`DEFAULT_SERVICE_NAME`].
    pub service_name: Option<String>,
    /// Milliseconds a finished span may wait to be exported with others
    /// (the batch processor's scheduled delay; OTel's default is 5000).
    pub export_delay_ms: Option<u64>,
    /// The `OTEL_*` variables the process was started with.
    #[serde(skip)]
    pub env: OtelEnv,
}

/// The standard variables `[tracing]` falls back on, as read at start-up.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct OtelEnv {
    pub endpoint: Option<String>,
    pub traces_endpoint: Option<String>,
    pub service_name: Option<String>,
    /// Headers every export carries (a collector's API key, a tenant),
    /// and the variable that gave them: the signal's, else the general
    /// one.
    pub headers: Option<(String, &'static str)>,
}

impl OtelEnv {
    /// The variables as `var` reads them; an empty one counts as unset
    /// (OTel SDK configuration says so).
    pub fn read(var: impl Fn(&str) -> Option<String>) -> Self {
        let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        Self {
            endpoint: get(OTEL_EXPORTER_OTLP_ENDPOINT),
            traces_endpoint: get(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT),
            service_name: get(OTEL_SERVICE_NAME),
            headers: get(OTEL_EXPORTER_OTLP_TRACES_HEADERS)
                .map(|h| (h, OTEL_EXPORTER_OTLP_TRACES_HEADERS))
                .or_else(|| {
                    get(OTEL_EXPORTER_OTLP_HEADERS).map(|h| (h, OTEL_EXPORTER_OTLP_HEADERS))
                }),
        }
    }
}

/// One header an export carries.
pub type ExportHeader = (http::HeaderName, http::HeaderValue);

impl TracingConfig {
    /// The same, falling back on `env` where the file says nothing.
    pub fn with_env(self, env: OtelEnv) -> Self {
        Self { env, ..self }
    }

    /// Where spans are POSTed, and what says so (for messages); `None`
    /// when tracing is off. The file's key comes first, then the
    /// signal-specific variable (used as it is), then the general one
    /// (with `/v1/traces` appended), as the OTLP exporter specification
    /// orders the variables.
    pub fn traces_url(&self) -> Option<(String, &'static str)> {
        if let Some(base) = &self.otlp_endpoint {
            return Some((with_traces_path(base), "tracing.otlp_endpoint"));
        }
        if let Some(url) = &self.env.traces_endpoint {
            return Some((url.trim().to_owned(), OTEL_EXPORTER_OTLP_TRACES_ENDPOINT));
        }
        let base = self.env.endpoint.as_ref()?;
        Some((with_traces_path(base), OTEL_EXPORTER_OTLP_ENDPOINT))
    }

    /// `service.name`: the file's, else `OTEL_SERVICE_NAME`, else the default.
    pub fn service_name(&self) -> &str {
        self.service_name
            .as_deref()
            .or(self.env.service_name.as_deref())
            .unwrap_or(DEFAULT_SERVICE_NAME)
    }

    /// The headers every export carries: the OTLP exporter
    /// specification's `key1=value1,key2=value2`, values percent-encoded.
    /// An error names the variable, never a value (it may be a secret).
    pub fn export_headers(&self) -> Result<Vec<ExportHeader>, ConfigError> {
        let Some((list, var)) = &self.env.headers else {
            return Ok(Vec::new());
        };
        let mut headers = Vec::new();
        for (n, pair) in list.split(',').enumerate() {
            if pair.trim().is_empty() {
                continue;
            }
            let bad = |what: &str| ConfigError(format!("{var}: entry {} {what}", n + 1));
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| bad("is not key=value"))?;
            let name = http::HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|_| bad("does not name a header"))?;
            let value = percent_encoding::percent_decode_str(value.trim()).collect::<Vec<u8>>();
            let value = http::HeaderValue::from_bytes(&value)
                .map_err(|_| bad("has a value no header may hold"))?;
            headers.push((name, value));
        }
        Ok(headers)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |msg: String| Err(ConfigError(msg));
        self.export_headers()?;
        if let Some((url, key)) = self.traces_url() {
            let ok = url.parse::<http::Uri>().is_ok_and(|uri| {
                matches!(uri.scheme_str(), Some("http" | "https")) && uri.authority().is_some()
            });
            if !ok {
                return fail(format!(
                    "{key} does not make an http:// or https:// URL (it gives {url:?})"
                ));
            }
        }
        if self.service_name.as_deref().is_some_and(str::is_empty) {
            return fail("tracing.service_name must not be empty".into());
        }
        if self.export_delay_ms == Some(0) {
            return fail("tracing.export_delay_ms must be greater than 0".into());
        }
        Ok(())
    }
}

/// `base` with the traces path appended, one slash between them.
fn with_traces_path(base: &str) -> String {
    format!("{}{TRACES_PATH}", base.trim().trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_headers(list: &str) -> TracingConfig {
        TracingConfig::default().with_env(OtelEnv {
            headers: Some((list.into(), OTEL_EXPORTER_OTLP_HEADERS)),
            ..OtelEnv::default()
        })
    }

    #[test]
    fn export_headers_are_key_value_pairs_with_percent_encoded_values() {
        let config = with_headers("api-key=s%3Dcr%2Ct , X-Tenant = t1,,authorization=Bearer%20abc");
        let headers: Vec<(String, String)> = config
            .export_headers()
            .unwrap()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        let want = [
            ("api-key", "s=cr,t"),
            ("x-tenant", "t1"),
            ("authorization", "Bearer abc"),
        ];
        assert_eq!(headers, want.map(|(k, v)| (k.to_owned(), v.to_owned())));
    }

    #[test]
    fn a_bad_export_header_is_refused_naming_the_variable_and_not_the_value() {
        for list in ["novalue", "bad name=x", "k=line%0Abreak"] {
            let err = with_headers(list).validate().unwrap_err().to_string();
            assert!(
                err.starts_with("OTEL_EXPORTER_OTLP_HEADERS: entry 1"),
                "{err}"
            );
            assert!(!err.contains("break") && !err.contains("novalue"), "{err}");
        }
    }

    #[test]
    fn the_signal_s_headers_variable_wins_over_the_general_one() {
        let env = OtelEnv::read(|name| match name {
            OTEL_EXPORTER_OTLP_HEADERS => Some("a=1".into()),
            OTEL_EXPORTER_OTLP_TRACES_HEADERS => Some("b=2".into()),
            _ => None,
        });
        assert_eq!(
            env.headers,
            Some(("b=2".into(), OTEL_EXPORTER_OTLP_TRACES_HEADERS))
        );
    }

    fn parse(text: &str) -> Result<TracingConfig, ConfigError> {
        let config: TracingConfig = toml::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    fn env(pairs: &[(&str, &str)]) -> OtelEnv {
        OtelEnv::read(|name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn tracing_is_off_until_an_endpoint_is_known() {
        let config = parse("").unwrap();
        assert_eq!(config.traces_url(), None);
        assert_eq!(config.service_name(), "mcp-resume-proxy");
    }

    #[test]
    fn the_endpoint_is_a_base_that_gets_the_traces_path() {
        let config = parse("otlp_endpoint = \"http://127.0.0.1:4318/\"").unwrap();
        let url = config.traces_url().unwrap().0;
        assert_eq!(url, "http://127.0.0.1:4318/v1/traces");
    }

    #[test]
    fn the_signal_variable_is_used_as_it_is_and_wins_over_the_general_one() {
        let config = TracingConfig::default().with_env(env(&[
            (OTEL_EXPORTER_OTLP_ENDPOINT, "http://general:4318"),
            (
                OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
                "http://traces:4318/custom",
            ),
        ]));
        assert_eq!(config.traces_url().unwrap().0, "http://traces:4318/custom");
        let config = TracingConfig::default()
            .with_env(env(&[(OTEL_EXPORTER_OTLP_ENDPOINT, "http://general:4318")]));
        let url = config.traces_url().unwrap().0;
        assert_eq!(url, "http://general:4318/v1/traces");
    }

    #[test]
    fn the_file_wins_over_the_environment_and_empty_variables_are_unset() {
        let config = parse("otlp_endpoint = \"http://file:4318\"\nservice_name = \"edge\"")
            .unwrap()
            .with_env(env(&[
                (
                    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
                    "http://traces:4318/v1/traces",
                ),
                (OTEL_SERVICE_NAME, "from-env"),
            ]));
        assert_eq!(config.traces_url().unwrap().0, "http://file:4318/v1/traces");
        assert_eq!(config.service_name(), "edge");
        let config = TracingConfig::default().with_env(env(&[
            (OTEL_EXPORTER_OTLP_ENDPOINT, " "),
            (OTEL_SERVICE_NAME, "from-env"),
        ]));
        assert_eq!(config.traces_url(), None);
        assert_eq!(config.service_name(), "from-env");
    }

    #[test]
    fn a_bad_endpoint_is_refused_naming_where_it_came_from() {
        let err = parse("otlp_endpoint = \"collector:4318\"").unwrap_err();
        assert!(err.0.starts_with("tracing.otlp_endpoint"), "{err}");
        let config = TracingConfig::default()
            .with_env(env(&[(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, "ftp://x/")]));
        let err = config.validate().unwrap_err();
        assert!(
            err.0.starts_with(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT),
            "{err}"
        );
        let err = parse("export_delay_ms = 0").unwrap_err();
        assert!(err.0.contains("tracing.export_delay_ms"), "{err}");
        assert!(parse("unknown = 1").is_err());
    }

    #[test]
    fn the_example_file_documents_every_key() {
        let text = include_str!("../../proxy.toml.example");
        let table = text.find("[tracing]").expect("a [tracing] table");
        for key in ["otlp_endpoint", "service_name", "export_delay_ms"] {
            assert!(text[table..].contains(key), "{key}");
        }
    }
}
