// placeholder until the demo upstream lands
#[derive(Clone, Debug, Default)]
pub struct DemoOptions;
pub struct DemoUpstream;
impl DemoUpstream {
    pub async fn spawn(_: std::net::SocketAddr, _: DemoOptions) -> std::io::Result<Self> {
        Ok(Self)
    }
    pub fn url(&self) -> String {
        String::new()
    }
    pub fn shutdown(&self) {}
}
