//! The series of each replica of an HTTP upstream: its requests in flight,
//! whether it is ejected, and its failures, labelled by upstream (its mount
//! path) and replica (a URL of `urls`, or an address of `resolve = "each"`).
//!
//! Unlike the other families, these label values are not known when the
//! registry is made: an upstream makes its replicas' series when it is
//! built and when its name resolves to a new address, and forgets a
//! replica's when the address goes, so that pods coming and going do not
//! grow the series count without bound. The values come from the
//! configuration and the resolver, never from a client. This owns the
//! series only: what counts as a failure or an ejection is the upstream's.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::requests::Name;

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReplicaLabels {
    upstream: Name,
    replica: Name,
}

/// The three families, registered once.
#[derive(Clone, Default)]
pub(super) struct ReplicaFamilies {
    in_flight: Family<ReplicaLabels, Gauge>,
    ejected: Family<ReplicaLabels, Gauge>,
    failures: Family<ReplicaLabels, Counter>,
}

impl ReplicaFamilies {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let families = Self::default();
        registry.register(
            "upstream_replica_in_flight",
            "Requests in flight on each replica of an HTTP upstream (an SSE answer counts until its body ends)",
            families.in_flight.clone(),
        );
        registry.register(
            "upstream_replica_ejected",
            "1 while a replica is taken out (eject_after failures in a row; back after its back-off, or at once on a passing health check), else 0",
            families.ejected.clone(),
        );
        registry.register(
            "upstream_replica_failures",
            "Failures of each replica that count toward its ejection: no connection, HTTP 502 to 504, a timeout, a stream silent past idle_timeout_ms, a failed health check",
            families.failures.clone(),
        );
        families
    }
}

/// One replica's series. Detached (counting for nobody) in unit tests.
#[derive(Clone, Default)]
pub struct ReplicaSeries {
    /// The replica's count of requests in flight, which the choice of the
    /// least busy replica reads too: one count, so the two cannot differ.
    pub in_flight: Gauge,
    pub ejected: Gauge,
    pub failures: Counter,
}

/// Makes and forgets the series of one upstream's replicas.
#[derive(Clone, Default)]
pub struct ReplicaMeter {
    families: Option<ReplicaFamilies>,
    upstream: Option<Arc<str>>,
}

impl ReplicaMeter {
    pub(super) fn new(families: &ReplicaFamilies, upstream: &str) -> Self {
        Self {
            families: Some(families.clone()),
            upstream: Some(Arc::from(upstream)),
        }
    }

    /// Series registered nowhere (for tests of the replica choice).
    pub fn detached() -> Self {
        Self::default()
    }

    fn labels(&self, replica: &str) -> Option<(&ReplicaFamilies, ReplicaLabels)> {
        let families = self.families.as_ref()?;
        let upstream = Name(self.upstream.clone()?);
        let replica = Name(Arc::from(replica));
        Some((families, ReplicaLabels { upstream, replica }))
    }

    /// The series of `replica`, made at zero if new. A replica of the same
    /// name on a rebuilt upstream (a reload) gets the same series.
    pub fn series(&self, replica: &str) -> ReplicaSeries {
        let Some((families, labels)) = self.labels(replica) else {
            return ReplicaSeries::default();
        };
        ReplicaSeries {
            in_flight: families.in_flight.get_or_create(&labels).clone(),
            ejected: families.ejected.get_or_create(&labels).clone(),
            failures: families.failures.get_or_create(&labels).clone(),
        }
    }

    /// Drops `replica`'s series from the page: its address is gone.
    pub fn forget(&self, replica: &str) {
        if let Some((families, labels)) = self.labels(replica) {
            families.in_flight.remove(&labels);
            families.ejected.remove(&labels);
            families.failures.remove(&labels);
        }
    }
}
