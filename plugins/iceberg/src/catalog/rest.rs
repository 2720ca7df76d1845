//! An Iceberg REST catalog, reached over `wasi:http` from inside the
//! component (the pipeline grants the catalog's host in `grants.http`).
//!
//! The routes are the REST catalog's v1 (`GET /v1/config`, then under
//! `/v1/{prefix}/`: namespaces, tables, and `POST` on a table to commit).
//! The request and answer bodies use the `iceberg` crate's serde types
//! (`TableMetadata`, `TableUpdate`, `TableRequirement`), so they are the
//! spec's JSON.
//!
//! A commit sends the changes from its base (`Next::changes`) with two
//! requirements, `assert-table-uuid` and `assert-ref-snapshot-id` on
//! `main` (plus `assert-current-schema-id` when it adds a schema): the
//! catalog applies them only if nobody committed since the base, and
//! answers 409 otherwise, which is [`CommitError::Conflict`] as in the
//! file-system catalog. What the sink does then (reload, fence, find its
//! own position, rebase) is in `table_commit.rs`.
//!
//! An answer that does not say whether the commit landed (a 5xx, a
//! timeout, a broken connection) is resolved here before anything else:
//! the table is reloaded, and if `main` now points at the snapshot this
//! commit added, it landed. Otherwise it did not (the requirements make
//! a later landing impossible once `main` moved, and a retry of the same
//! request is refused if the first one lands late), and the commit fails
//! as retryable; the files it wrote stay, named by nothing, until the
//! retry writes its own.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use iceberg::spec::{
    FormatVersion, MAIN_BRANCH, Schema, SortOrder, TableMetadata, UnboundPartitionSpec,
};
use iceberg::{Error, ErrorKind, Result, TableRequirement, TableUpdate};
use serde::{Deserialize, Serialize};
use weir_sdk::net::http::{HttpError, Request, Response};

use super::{Catalog, CommitError, Loaded, Next};
use crate::storage::Warehouse;

/// How the sink proves who it is to the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    None,
    /// `Authorization: Bearer <token>`, as configured.
    Bearer(String),
    /// OAuth2 client credentials: a token from `endpoint`, renewed before
    /// it expires and when the catalog answers 401.
    ClientCredentials {
        endpoint: Option<String>,
        client_id: String,
        client_secret: String,
        scope: String,
    },
}

/// The REST catalog's settings (the sink's `catalog_*` config keys).
#[derive(Debug, Clone)]
pub struct RestSettings {
    /// The catalog's base URL; the routes are under `<uri>/v1/`.
    pub uri: String,
    /// The path prefix; when absent, the one `/v1/config` gives.
    pub prefix: Option<String>,
    /// The warehouse to ask `/v1/config` for.
    pub warehouse: Option<String>,
    pub auth: Auth,
    /// Extra headers sent with every request.
    pub headers: Vec<(String, String)>,
    /// Bound on each request (connect, then each part of the exchange).
    pub timeout: Duration,
    /// Whether a new table is placed by the sink, at `<warehouse>/<its
    /// path>`, instead of where the catalog puts it.
    pub place_in_warehouse: bool,
}

/// A token and when to stop using it.
#[derive(Debug, Clone)]
struct Token {
    value: String,
    renew_at: Option<Instant>,
}

/// The REST catalog client (see the module documentation).
#[derive(Debug)]
pub struct RestCatalog {
    settings: RestSettings,
    /// The blob store root as readers see it: every table must live under it.
    warehouse: Warehouse,
    /// `<uri>/v1/` plus the prefix, once `/v1/config` was read.
    base: Mutex<Option<String>>,
    token: Mutex<Option<Token>>,
}

/// The largest answer read from the catalog: table metadata grows with its
/// snapshots and schemas, but not past this.
const MAX_ANSWER_BYTES: usize = 64 << 20;

/// Bodies of the routes used (the spec's names).
#[derive(Debug, Deserialize)]
struct ConfigAnswer {
    #[serde(default)]
    defaults: HashMap<String, String>,
    #[serde(default)]
    overrides: HashMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct LoadTableAnswer {
    #[serde(rename = "metadata-location")]
    metadata_location: Option<String>,
    metadata: TableMetadata,
}

#[derive(Debug, Serialize)]
struct CreateNamespaceRequest<'a> {
    namespace: &'a [String],
    properties: HashMap<String, String>,
}

#[derive(Debug, Serialize)]
struct CreateTableRequest<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    location: Option<String>,
    schema: &'a Schema,
    #[serde(rename = "partition-spec")]
    partition_spec: UnboundPartitionSpec,
    #[serde(rename = "write-order")]
    write_order: &'a SortOrder,
    #[serde(rename = "stage-create")]
    stage_create: bool,
    properties: &'a HashMap<String, String>,
}

#[derive(Debug, Serialize)]
struct CommitTableRequest<'a> {
    requirements: &'a [TableRequirement],
    updates: &'a [TableUpdate],
}

#[derive(Debug, Deserialize)]
struct TokenAnswer {
    access_token: String,
    expires_in: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct ErrorAnswer {
    error: ErrorModel,
}

#[derive(Debug, Deserialize)]
struct ErrorModel {
    message: Option<String>,
    r#type: Option<String>,
}

/// How an exchange with the catalog went.
enum Outcome {
    Answer(Response),
    /// No answer: the request may or may not have been applied.
    Lost(String),
}

impl RestCatalog {
    pub fn new(settings: RestSettings, warehouse: Warehouse) -> RestCatalog {
        RestCatalog {
            settings,
            warehouse,
            base: Mutex::new(None),
            token: Mutex::new(None),
        }
    }

    /// Checks the settings' URLs and headers without sending anything.
    pub fn validate(settings: &RestSettings) -> std::result::Result<(), String> {
        let mut request = Request::get(format!("{}/v1/config", settings.uri));
        for (name, value) in &settings.headers {
            request = request.header(name, value);
        }
        request.validate().map_err(|e| e.message().to_string())?;
        if let Auth::ClientCredentials {
            endpoint: Some(endpoint),
            ..
        } = &settings.auth
        {
            Request::post(endpoint.clone())
                .validate()
                .map_err(|e| e.message().to_string())?;
        }
        Ok(())
    }

    /// `<uri>/v1/<prefix>/`, reading `/v1/config` the first time.
    fn base(&self) -> Result<String> {
        let mut base = self.base.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(base) = base.as_ref() {
            return Ok(base.clone());
        }
        let mut url = format!("{}/v1/config", self.settings.uri);
        if let Some(warehouse) = &self.settings.warehouse {
            url.push_str("?warehouse=");
            url.push_str(&encode(warehouse));
        }
        let answer = self.exchange("GET", &url, None)?;
        let config: ConfigAnswer = self.expect_json(answer, "reading the catalog's config")?;
        // The catalog's overrides win over the sink's settings, which win
        // over its defaults (the REST spec's order).
        let prefix = config
            .overrides
            .get("prefix")
            .or(self.settings.prefix.as_ref())
            .or(config.defaults.get("prefix"))
            .map(|p| p.trim_matches('/').to_string())
            .filter(|p| !p.is_empty());
        let made = match prefix {
            Some(prefix) => format!("{}/v1/{prefix}/", self.settings.uri),
            None => format!("{}/v1/", self.settings.uri),
        };
        *base = Some(made.clone());
        Ok(made)
    }

    /// A request with its headers (auth, extra, JSON), sent once; a 401
    /// with client credentials renews the token and sends it again.
    fn send(&self, method: &str, url: &str, body: Option<&[u8]>) -> Result<Outcome> {
        let mut renewed = false;
        loop {
            let mut request = Request::new(method, url)
                .timeout(self.settings.timeout)
                .max_response_bytes(MAX_ANSWER_BYTES)
                .header("Accept", "application/json");
            if let Some(body) = body {
                request = request
                    .header("Content-Type", "application/json")
                    .body(body.to_vec());
            }
            if let Some(token) = self.token(renewed)? {
                request = request.header("Authorization", format!("Bearer {token}"));
            }
            for (name, value) in &self.settings.headers {
                request = request.header(name, value);
            }
            let response = match request.send() {
                Ok(response) => response,
                Err(HttpError::Timeout(m)) | Err(HttpError::Connection(m)) => {
                    return Ok(Outcome::Lost(m));
                }
                Err(e) => return Err(http_error(method, url, &e)),
            };
            if response.status == 401
                && !renewed
                && matches!(self.settings.auth, Auth::ClientCredentials { .. })
            {
                renewed = true;
                continue;
            }
            return Ok(Outcome::Answer(response));
        }
    }

    /// [`RestCatalog::send`] where a lost answer is only a retryable error.
    fn exchange(&self, method: &str, url: &str, body: Option<&[u8]>) -> Result<Response> {
        match self.send(method, url, body)? {
            Outcome::Answer(response) => Ok(response),
            Outcome::Lost(why) => Err(retryable(format!(
                "the Iceberg REST catalog did not answer {method} {url}: {why}"
            ))),
        }
    }

    /// The bearer token to send, if any; a new one when `renew`.
    fn token(&self, renew: bool) -> Result<Option<String>> {
        let (endpoint, client_id, client_secret, scope) = match &self.settings.auth {
            Auth::None => return Ok(None),
            Auth::Bearer(token) => return Ok(Some(token.clone())),
            Auth::ClientCredentials {
                endpoint,
                client_id,
                client_secret,
                scope,
            } => (endpoint, client_id, client_secret, scope),
        };
        let mut held = self.token.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(token) = held.as_ref()
            && !renew
            && token.renew_at.is_none_or(|at| Instant::now() < at)
        {
            return Ok(Some(token.value.clone()));
        }
        let url = endpoint
            .clone()
            .unwrap_or_else(|| format!("{}/v1/oauth/tokens", self.settings.uri));
        let form = format!(
            "grant_type=client_credentials&client_id={}&client_secret={}&scope={}",
            encode(client_id),
            encode(client_secret),
            encode(scope)
        );
        let mut request = Request::post(url.clone())
            .timeout(self.settings.timeout)
            .header("Content-Type", "application/x-www-form-urlencoded")
            .header("Accept", "application/json")
            .body(form.into_bytes());
        for (name, value) in &self.settings.headers {
            request = request.header(name, value);
        }
        let response = match request.send() {
            Ok(response) => response,
            Err(HttpError::Timeout(m)) | Err(HttpError::Connection(m)) => {
                return Err(retryable(format!(
                    "the OAuth2 token endpoint {url} did not answer: {m}"
                )));
            }
            Err(e) => return Err(http_error("POST", &url, &e)),
        };
        if !response.is_success() {
            return Err(answer_error(
                &response,
                &format!("getting an OAuth2 token from {url} (client credentials)"),
            ));
        }
        let answer: TokenAnswer = serde_json::from_slice(&response.body).map_err(|e| {
            Error::new(
                ErrorKind::DataInvalid,
                format!("the OAuth2 token endpoint {url} answered what is not a token: {e}"),
            )
        })?;
        // Renewed when a tenth of its life is left (at least a minute
        // before it ends), so no request goes out with a token about to
        // expire on its way.
        let renew_at = answer.expires_in.map(|seconds| {
            let life = Duration::from_secs(seconds);
            let margin = (life / 10).max(Duration::from_secs(60)).min(life / 2);
            Instant::now() + life - margin
        });
        *held = Some(Token {
            value: answer.access_token.clone(),
            renew_at,
        });
        Ok(Some(answer.access_token))
    }

    fn expect_json<T: serde::de::DeserializeOwned>(
        &self,
        response: Response,
        what: &str,
    ) -> Result<T> {
        if !response.is_success() {
            return Err(answer_error(&response, what));
        }
        serde_json::from_slice(&response.body).map_err(|e| {
            Error::new(
                ErrorKind::DataInvalid,
                format!(
                    "{what}: the Iceberg REST catalog answered JSON this sink cannot read: {e}"
                ),
            )
        })
    }

    /// The URL of a table, and of its namespace's tables.
    fn table_urls(&self, table_path: &str) -> Result<(String, String, String, Vec<String>)> {
        let base = self.base()?;
        let mut parts: Vec<String> = table_path.split('/').map(str::to_string).collect();
        let name = parts.pop().unwrap_or_default();
        let namespace = parts;
        let ns = namespace
            .iter()
            .map(|p| encode(p))
            .collect::<Vec<_>>()
            .join("%1F");
        let tables = format!("{base}namespaces/{ns}/tables");
        let table = format!("{tables}/{}", encode(&name));
        Ok((table, tables, name, namespace))
    }

    /// A table's answer as a [`Loaded`], refusing one that lives outside
    /// the blob store this sink writes to.
    fn loaded(&self, table_path: &str, answer: LoadTableAnswer) -> Result<Loaded> {
        let location = answer.metadata.location().to_string();
        if self.warehouse.path(&location).is_err() {
            return Err(Error::new(
                ErrorKind::DataInvalid,
                format!(
                    "the Iceberg REST catalog keeps table {table_path} at {location}, outside \
                     this sink's blob store {}: the sink writes data files only under its \
                     `warehouse` (set `warehouse` to where the catalog keeps its tables, and \
                     grant the sink that blob store)",
                    self.warehouse.location("").trim_end_matches('/')
                ),
            ));
        }
        let metadata_location = answer.metadata_location.unwrap_or_default();
        Ok(Loaded {
            version: metadata_version(&metadata_location),
            location: metadata_location,
            metadata: answer.metadata,
        })
    }

    /// Creates the namespace if it is missing (a 409 means it exists).
    fn ensure_namespace(&self, namespace: &[String]) -> Result<()> {
        if namespace.is_empty() {
            return Ok(());
        }
        let url = format!("{}namespaces", self.base()?);
        let body = json(&CreateNamespaceRequest {
            namespace,
            properties: HashMap::new(),
        })?;
        let response = self.exchange("POST", &url, Some(&body))?;
        if response.is_success() || response.status == 409 {
            return Ok(());
        }
        Err(answer_error(
            &response,
            &format!("creating namespace {}", namespace.join(".")),
        ))
    }
}

impl Catalog for RestCatalog {
    fn load(&self, table_path: &str) -> Result<Option<Loaded>> {
        let (url, ..) = self.table_urls(table_path)?;
        let response = self.exchange("GET", &url, None)?;
        if response.status == 404 {
            return Ok(None);
        }
        let answer: LoadTableAnswer =
            self.expect_json(response, &format!("loading table {table_path}"))?;
        self.loaded(table_path, answer).map(Some)
    }

    fn create(
        &self,
        table_path: &str,
        metadata: &TableMetadata,
    ) -> std::result::Result<Loaded, CommitError> {
        if metadata.format_version() != FormatVersion::V2 {
            return Err(CommitError::Failed(Error::new(
                ErrorKind::FeatureUnsupported,
                "only Iceberg format v2 tables are created",
            )));
        }
        let (url, tables, name, namespace) = self.table_urls(table_path)?;
        self.ensure_namespace(&namespace)?;
        let body = json(&CreateTableRequest {
            name: &name,
            location: self
                .settings
                .place_in_warehouse
                .then(|| self.warehouse.location(table_path)),
            schema: metadata.current_schema(),
            partition_spec: metadata
                .default_partition_spec()
                .as_ref()
                .clone()
                .into_unbound(),
            write_order: metadata.default_sort_order(),
            stage_create: false,
            properties: metadata.properties(),
        })?;
        let response = self.exchange("POST", &tables, Some(&body))?;
        if response.status == 409 {
            return Err(CommitError::Conflict);
        }
        let answer: LoadTableAnswer =
            self.expect_json(response, &format!("creating table {table_path}"))?;
        match self.loaded(table_path, answer) {
            Ok(loaded) => Ok(loaded),
            Err(outside) => {
                // Just made and empty: taken back, so that the next start
                // (with `warehouse` set right) creates it where it can write.
                let _ = self.send("DELETE", &url, None);
                Err(CommitError::Failed(outside))
            }
        }
    }

    fn commit(
        &self,
        table_path: &str,
        base: &Loaded,
        next: Next,
    ) -> std::result::Result<Loaded, CommitError> {
        let (url, ..) = self.table_urls(table_path)?;
        let requirements = requirements(&base.metadata, &next.changes);
        let body = json(&CommitTableRequest {
            requirements: &requirements,
            updates: &next.changes,
        })?;
        let why = match self.send("POST", &url, Some(&body))? {
            Outcome::Answer(response) if response.is_success() => {
                let answer: LoadTableAnswer =
                    self.expect_json(response, &format!("committing table {table_path}"))?;
                return Ok(self.loaded(table_path, answer)?);
            }
            Outcome::Answer(response) if response.status == 409 => {
                return Err(CommitError::Conflict);
            }
            Outcome::Answer(response) if response.status >= 500 => {
                answer_error(&response, "").to_string()
            }
            Outcome::Answer(response) => {
                return Err(CommitError::Failed(answer_error(
                    &response,
                    &format!("committing table {table_path}"),
                )));
            }
            Outcome::Lost(why) => why,
        };
        // The commit may or may not have landed: the table says which.
        let wanted = main_snapshot(&next.metadata);
        let now = self.load(table_path)?.ok_or_else(|| {
            Error::new(
                ErrorKind::DataInvalid,
                format!("table {table_path} disappeared from the catalog during a commit"),
            )
        })?;
        if wanted.is_some() && main_snapshot(&now.metadata) == wanted {
            weir_sdk::log::info(format!(
                "table {table_path}: the Iceberg REST catalog's answer to a commit was lost or \
                 failed ({why}); the table shows it landed"
            ));
            return Ok(now);
        }
        Err(CommitError::Failed(retryable(format!(
            "table {table_path}: the Iceberg REST catalog's answer to the commit does not say \
             whether it landed ({why}); the table shows it did not, so it is tried again"
        ))))
    }

    fn table_location(&self, table_path: &str) -> String {
        self.warehouse.location(table_path)
    }

    fn remove_old_metadata(&self, _table_path: &str, _loaded: &Loaded) -> usize {
        0
    }
}

/// What the catalog must check before it applies `changes` to `base`:
/// the same table, `main` where the base had it, and the base's schema if
/// the changes add one.
fn requirements(base: &TableMetadata, changes: &[TableUpdate]) -> Vec<TableRequirement> {
    let mut wanted = vec![
        TableRequirement::UuidMatch { uuid: base.uuid() },
        TableRequirement::RefSnapshotIdMatch {
            r#ref: MAIN_BRANCH.to_string(),
            snapshot_id: main_snapshot(base),
        },
    ];
    if changes
        .iter()
        .any(|c| matches!(c, TableUpdate::AddSchema { .. }))
    {
        wanted.push(TableRequirement::CurrentSchemaIdMatch {
            current_schema_id: base.current_schema_id(),
        });
        wanted.push(TableRequirement::LastAssignedFieldIdMatch {
            last_assigned_field_id: base.last_column_id(),
        });
    }
    wanted
}

fn main_snapshot(metadata: &TableMetadata) -> Option<i64> {
    metadata
        .snapshot_for_ref(MAIN_BRANCH)
        .map(|s| s.snapshot_id())
}

/// The version number a metadata file's name starts with
/// (`00003-<uuid>.metadata.json`, `v3.metadata.json`), or 0.
fn metadata_version(location: &str) -> u64 {
    let name = location.rsplit('/').next().unwrap_or_default();
    let digits: String = name
        .trim_start_matches('v')
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap_or(0)
}

fn json<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| {
        Error::new(
            ErrorKind::Unexpected,
            format!("cannot serialize a catalog request: {e}"),
        )
    })
}

fn retryable(message: String) -> Error {
    Error::new(ErrorKind::Unexpected, message).with_retryable(true)
}

fn http_error(method: &str, url: &str, e: &HttpError) -> Error {
    let message = match e {
        HttpError::Denied(m) => {
            format!("{method} {url}: the sink may not reach the Iceberg REST catalog: {m}")
        }
        other => format!("{method} {url}: {}", other.message()),
    };
    Error::new(ErrorKind::Unexpected, message)
}

/// An unsuccessful answer as an error naming the status and the catalog's
/// own message; 5xx, 429 and 408 are retryable.
fn answer_error(response: &Response, what: &str) -> Error {
    let said = serde_json::from_slice::<ErrorAnswer>(&response.body)
        .ok()
        .map(|a| {
            format!(
                "{}{}",
                a.error.r#type.map(|t| format!("{t}: ")).unwrap_or_default(),
                a.error.message.unwrap_or_default()
            )
        })
        .unwrap_or_else(|| {
            let text = response.text();
            text.chars().take(300).collect()
        });
    let hint = match response.status {
        401 => {
            " (the catalog refused the sink's credentials: check `catalog_token` or `catalog_credential`)"
        }
        403 => " (the catalog's principal may not do this)",
        _ => "",
    };
    let prefix = if what.is_empty() {
        String::new()
    } else {
        format!("{what}: ")
    };
    let error = Error::new(
        ErrorKind::Unexpected,
        format!(
            "{prefix}the Iceberg REST catalog answered {}: {said}{hint}",
            response.status
        ),
    );
    if response.status >= 500 || response.status == 429 || response.status == 408 {
        error.with_retryable(true)
    } else {
        error
    }
}

/// Percent-encodes a path segment or form value (unreserved bytes stay).
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_versions_parse_from_either_naming() {
        assert_eq!(
            metadata_version("s3://b/t/metadata/00012-0f1e.metadata.json"),
            12
        );
        assert_eq!(metadata_version("file:///l/t/metadata/v7.metadata.json"), 7);
        assert_eq!(
            metadata_version("file:///l/t/metadata/abc.metadata.json"),
            0
        );
        assert_eq!(metadata_version(""), 0);
    }

    #[test]
    fn names_are_percent_encoded() {
        assert_eq!(encode("sales"), "sales");
        assert_eq!(encode("a b/c"), "a%20b%2Fc");
        assert_eq!(encode("k=v&x"), "k%3Dv%26x");
    }
}
