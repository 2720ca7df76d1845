//! Where the cluster's state lives in etcd, all under one prefix:
//!
//! | key | value | written by |
//! | --- | --- | --- |
//! | `members/<host>` | the host's admin address, on its lease | each host |
//! | `leader` | the leading host's name, on its lease | the leader |
//! | `pipelines/<tenant>/<pipeline>` | what placement weighs (JSON) | the hosts that define it |
//! | `placements/<tenant>/<pipeline>` | the host it should run on | the leader (and a host leaving) |
//! | `assignments/<tenant>/<pipeline>` | its owner's name, on the owner's lease | the owner |
//! | `epochs/<tenant>/<pipeline>` | the fencing epoch, decimal | each claim and run |
//! | `positions/<tenant>/<pipeline>/<sink>/<table>` | the position's bytes | the owner, under its epoch |
//! | `files/<tenant>/<file>` | a pipelines-folder file: its digest, and a pipeline file's text | the host where it changed |

use std::fmt;

// One rule for every name that becomes a segment of a key: the one
// tenant, pipeline and sink names already follow, so no name can pass
// one check and make a key another reader takes for a different key.
pub use weir_pipeline::config::check_name;

/// A pipeline, cluster-wide: its tenant and its name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PipelineId {
    pub tenant: String,
    pub name: String,
}

impl PipelineId {
    pub fn new(tenant: &str, name: &str) -> Self {
        PipelineId {
            tenant: tenant.to_string(),
            name: name.to_string(),
        }
    }

    /// Reads `<tenant>/<pipeline>`, the tail of a key.
    pub fn parse(text: &str) -> Option<Self> {
        let (tenant, name) = text.split_once('/')?;
        (check_name("tenant", tenant).is_ok() && check_name("pipeline", name).is_ok())
            .then(|| PipelineId::new(tenant, name))
    }
}

impl fmt::Display for PipelineId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant, self.name)
    }
}

#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Keys {
            prefix: prefix.to_string(),
        }
    }

    pub fn members(&self) -> String {
        format!("{}/members/", self.prefix)
    }

    pub fn member(&self, host: &str) -> String {
        format!("{}{host}", self.members())
    }

    pub fn leader(&self) -> String {
        format!("{}/leader", self.prefix)
    }

    pub fn pipelines(&self) -> String {
        format!("{}/pipelines/", self.prefix)
    }

    pub fn pipeline(&self, id: &PipelineId) -> String {
        format!("{}{id}", self.pipelines())
    }

    pub fn placements(&self) -> String {
        format!("{}/placements/", self.prefix)
    }

    pub fn placement(&self, id: &PipelineId) -> String {
        format!("{}{id}", self.placements())
    }

    pub fn assignments(&self) -> String {
        format!("{}/assignments/", self.prefix)
    }

    pub fn assignment(&self, id: &PipelineId) -> String {
        format!("{}{id}", self.assignments())
    }

    /// The files of the tenants' pipelines folders (with a plugin store).
    pub fn files(&self) -> String {
        format!("{}/files/", self.prefix)
    }

    pub fn file(&self, tenant: &str, file: &str) -> String {
        format!("{}{tenant}/{file}", self.files())
    }

    pub fn epoch(&self, id: &PipelineId) -> String {
        format!("{}/epochs/{id}", self.prefix)
    }

    /// Every position of one pipeline: `<sink>/<table>` follows.
    pub fn positions(&self, id: &PipelineId) -> String {
        format!("{}/positions/{id}/", self.prefix)
    }

    pub fn position(&self, id: &PipelineId, sink: &str, table: &str) -> String {
        format!("{}{sink}/{table}", self.positions(id))
    }

    /// The `<tenant>/<pipeline>` a key under `under` names.
    pub fn id_in(under: &str, key: &[u8]) -> Option<PipelineId> {
        let key = std::str::from_utf8(key).ok()?;
        PipelineId::parse(key.strip_prefix(under)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_back_as_the_pipeline_they_name() {
        let keys = Keys::new("/weir");
        let id = PipelineId::new("acme", "orders");
        let key = keys.assignment(&id);
        assert_eq!(key, "/weir/assignments/acme/orders");
        assert_eq!(
            Keys::id_in(&keys.assignments(), key.as_bytes()),
            Some(id.clone())
        );
        assert_eq!(Keys::id_in(&keys.placements(), key.as_bytes()), None);
        assert_eq!(
            keys.position(&id, "lake", "shop.orders"),
            "/weir/positions/acme/orders/lake/shop.orders"
        );
        assert_eq!(PipelineId::parse("acme/orders/x"), None);
        assert_eq!(PipelineId::parse("acme/.."), None);
    }
}
