package e2bapi

import (
	"math"
	"time"
)

// The response schemas of docs/e2b-protocol.md §1.3 and §1.6. Field names
// are the wire's, exactly; what is required there is never omitempty here.

// legacyClientID is what e2b returns as clientID; Skiff returns the node's
// name and falls back to it only when the backend names no node (Python
// requires the key).
const legacyClientID = "6532622b"

// sandboxJSON is e2b's Sandbox: the answer to create, connect and resume.
type sandboxJSON struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// sandboxDetailJSON is e2b's SandboxDetail (GET /sandboxes/{id}).
type sandboxDetailJSON struct {
	TemplateID          string            `json:"templateID"`
	Alias               string            `json:"alias,omitempty"`
	SandboxID           string            `json:"sandboxID"`
	ClientID            string            `json:"clientID"`
	StartedAt           time.Time         `json:"startedAt"`
	EndAt               time.Time         `json:"endAt"`
	EnvdVersion         string            `json:"envdVersion"`
	EnvdAccessToken     string            `json:"envdAccessToken,omitempty"`
	AllowInternetAccess *bool             `json:"allowInternetAccess"`
	Domain              *string           `json:"domain"`
	CPUCount            int32             `json:"cpuCount"`
	MemoryMB            int32             `json:"memoryMB"`
	DiskSizeMB          int32             `json:"diskSizeMB"`
	Metadata            map[string]string `json:"metadata"`
	State               State             `json:"state"`
	Lifecycle           lifecycleJSON     `json:"lifecycle"`
	Network             *networkJSON      `json:"network,omitempty"`
	VolumeMounts        []volumeMountJSON `json:"volumeMounts"`
}

// listedSandboxJSON is e2b's ListedSandbox (GET /sandboxes, /v2/sandboxes).
type listedSandboxJSON struct {
	TemplateID   string            `json:"templateID"`
	Alias        string            `json:"alias,omitempty"`
	SandboxID    string            `json:"sandboxID"`
	ClientID     string            `json:"clientID"`
	StartedAt    time.Time         `json:"startedAt"`
	EndAt        time.Time         `json:"endAt"`
	CPUCount     int32             `json:"cpuCount"`
	MemoryMB     int32             `json:"memoryMB"`
	DiskSizeMB   int32             `json:"diskSizeMB"`
	Metadata     map[string]string `json:"metadata"`
	State        State             `json:"state"`
	EnvdVersion  string            `json:"envdVersion"`
	VolumeMounts []volumeMountJSON `json:"volumeMounts"`
}

type lifecycleJSON struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

// networkJSON is the part of e2b's SandboxNetworkConfig that Skiff keeps
// per sandbox; the rules as they were given, each only when set.
type networkJSON struct {
	AllowPublicTraffic bool     `json:"allowPublicTraffic"`
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
	MaskRequestHost    string   `json:"maskRequestHost,omitempty"`
}

type volumeMountJSON struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// metricJSON is e2b's SandboxMetric; every field is required.
type metricJSON struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int32     `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

type sandboxesWithMetricsJSON struct {
	Sandboxes map[string]metricJSON `json:"sandboxes"`
}

type logLineJSON struct {
	Timestamp time.Time `json:"timestamp"`
	Line      string    `json:"line"`
}

type logEntryJSON struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

// sandboxLogsJSON is e2b's SandboxLogs (the deprecated v1 logs route).
type sandboxLogsJSON struct {
	Logs       []logLineJSON  `json:"logs"`
	LogEntries []logEntryJSON `json:"logEntries"`
}

// sandboxLogsV2JSON is e2b's SandboxLogsV2Response.
type sandboxLogsV2JSON struct {
	Logs []logEntryJSON `json:"logs"`
}

// templateJSON is e2b's Template.
type templateJSON struct {
	TemplateID    string     `json:"templateID"`
	BuildID       string     `json:"buildID"`
	CPUCount      int32      `json:"cpuCount"`
	MemoryMB      int32      `json:"memoryMB"`
	DiskSizeMB    int32      `json:"diskSizeMB"`
	Public        bool       `json:"public"`
	Aliases       []string   `json:"aliases"`
	Names         []string   `json:"names"`
	CreatedAt     time.Time  `json:"createdAt"`
	UpdatedAt     time.Time  `json:"updatedAt"`
	CreatedBy     *teamUser  `json:"createdBy"`
	LastSpawnedAt *time.Time `json:"lastSpawnedAt"`
	SpawnCount    int64      `json:"spawnCount"`
	BuildCount    int32      `json:"buildCount"`
	EnvdVersion   string     `json:"envdVersion"`
	BuildStatus   string     `json:"buildStatus"`
}

type teamUser struct {
	ID    string  `json:"id"`
	Email *string `json:"email"`
}

// templateWithBuildsJSON is e2b's TemplateWithBuilds.
type templateWithBuildsJSON struct {
	TemplateID    string              `json:"templateID"`
	Public        bool                `json:"public"`
	Aliases       []string            `json:"aliases"`
	Names         []string            `json:"names"`
	CreatedAt     time.Time           `json:"createdAt"`
	UpdatedAt     time.Time           `json:"updatedAt"`
	LastSpawnedAt *time.Time          `json:"lastSpawnedAt"`
	SpawnCount    int64               `json:"spawnCount"`
	Builds        []templateBuildJSON `json:"builds"`
}

// templateBuildJSON is e2b's TemplateBuild.
type templateBuildJSON struct {
	BuildID     string    `json:"buildID"`
	Status      string    `json:"status"`
	CreatedAt   time.Time `json:"createdAt"`
	UpdatedAt   time.Time `json:"updatedAt"`
	FinishedAt  time.Time `json:"finishedAt"`
	CPUCount    int32     `json:"cpuCount"`
	MemoryMB    int32     `json:"memoryMB"`
	DiskSizeMB  int32     `json:"diskSizeMB"`
	EnvdVersion string    `json:"envdVersion"`
}

// templateAliasJSON is e2b's TemplateAliasResponse.
type templateAliasJSON struct {
	TemplateID string `json:"templateID"`
	Public     bool   `json:"public"`
}

// cpuCount turns thousandths of a core into e2b's whole cores (≥ 1),
// rounding up so a sandbox never reports less than it may use.
func cpuCount(milli int64) int32 {
	c := (milli + 999) / 1000
	return clamp32(max(c, 1))
}

// clamp32 fits a count into e2b's int32 fields.
func clamp32(v int64) int32 {
	return int32(min(max(v, 0), math.MaxInt32))
}

func (s *server) clientID(sb *Sandbox) string {
	if sb.Node == "" {
		return legacyClientID
	}
	return sb.Node
}

func (s *server) sandboxJSON(sb *Sandbox) sandboxJSON {
	out := sandboxJSON{
		TemplateID:      sb.TemplateID,
		SandboxID:       sb.ID,
		Alias:           sb.Alias,
		ClientID:        s.clientID(sb),
		EnvdVersion:     sb.EnvdVersion,
		EnvdAccessToken: sb.EnvdAccessToken,
		Domain:          s.domain,
	}
	if sb.TrafficAccessToken != "" {
		tok := sb.TrafficAccessToken
		out.TrafficAccessToken = &tok
	}
	return out
}

func (s *server) detailJSON(sb *Sandbox) sandboxDetailJSON {
	onTimeout := "kill"
	if sb.AutoPause {
		onTimeout = "pause"
	}
	out := sandboxDetailJSON{
		TemplateID:          sb.TemplateID,
		Alias:               sb.Alias,
		SandboxID:           sb.ID,
		ClientID:            s.clientID(sb),
		StartedAt:           sb.StartedAt.UTC(),
		EndAt:               sb.EndAt.UTC(),
		EnvdVersion:         sb.EnvdVersion,
		EnvdAccessToken:     sb.EnvdAccessToken,
		AllowInternetAccess: sb.AllowInternetAccess,
		Domain:              s.domain,
		CPUCount:            cpuCount(sb.CPUMilli),
		MemoryMB:            clamp32(sb.MemoryMB),
		DiskSizeMB:          clamp32(sb.DiskMB),
		Metadata:            nonNilMap(sb.Metadata),
		State:               sb.State,
		Lifecycle:           lifecycleJSON{AutoResume: sb.AutoResume, OnTimeout: onTimeout},
		VolumeMounts:        volumeMountsJSON(sb.VolumeMounts),
	}
	if sb.State == StatePaused {
		out.Domain = nil // as e2b's: a paused sandbox is reached through connect
	}
	if sb.AllowPublicTraffic != nil || sb.AllowOut != nil || sb.DenyOut != nil || sb.MaskRequestHost != "" {
		out.Network = &networkJSON{AllowPublicTraffic: sb.AllowPublicTraffic == nil || *sb.AllowPublicTraffic,
			AllowOut: sb.AllowOut, DenyOut: sb.DenyOut, MaskRequestHost: sb.MaskRequestHost}
	}
	return out
}

func (s *server) listedJSON(sb *Sandbox) listedSandboxJSON {
	return listedSandboxJSON{
		TemplateID:   sb.TemplateID,
		Alias:        sb.Alias,
		SandboxID:    sb.ID,
		ClientID:     s.clientID(sb),
		StartedAt:    sb.StartedAt.UTC(),
		EndAt:        sb.EndAt.UTC(),
		CPUCount:     cpuCount(sb.CPUMilli),
		MemoryMB:     clamp32(sb.MemoryMB),
		DiskSizeMB:   clamp32(sb.DiskMB),
		Metadata:     nonNilMap(sb.Metadata),
		State:        sb.State,
		EnvdVersion:  sb.EnvdVersion,
		VolumeMounts: volumeMountsJSON(sb.VolumeMounts),
	}
}

func nonNilMap(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}
