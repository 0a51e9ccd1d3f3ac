package envd

// Version is the envd version Skiff's envd reports (X-Envd-Version, --version,
// and through the API as envdVersion). The e2b SDKs gate features on it
// (docs/envd.md lists the gates); it is the highest e2b envd version whose
// gated features this envd implements in full.
const Version = "0.6.4"
