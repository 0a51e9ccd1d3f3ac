package service

import (
	"maps"
	"slices"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/skiff-dev/skiff/sandboxd/internal/registry"
	"github.com/skiff-dev/skiff/sandboxd/internal/store"
	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// toState maps a record's state to the API's.
func toState(s string) pb.SandboxState {
	switch s {
	case registry.StateRunning:
		return pb.SandboxState_SANDBOX_STATE_RUNNING
	case registry.StatePaused:
		return pb.SandboxState_SANDBOX_STATE_PAUSED
	case registry.StateWarm:
		return pb.SandboxState_SANDBOX_STATE_WARM
	}
	return pb.SandboxState_SANDBOX_STATE_UNSPECIFIED
}

// toSandbox is a record as the API shows it: everything but its tokens and
// the host's own handles on it.
func (s *Service) toSandbox(rec *store.Record) *pb.Sandbox {
	sb := &pb.Sandbox{
		Id:                  rec.ID,
		Template:            rec.Template,
		TemplateVersion:     rec.TemplateVersion,
		State:               toState(rec.State),
		Pool:                rec.Pool,
		Team:                rec.Team,
		Metadata:            maps.Clone(rec.Metadata),
		StartedAt:           timestamppb.New(rec.StartedAt),
		Resources:           &pb.Resources{CpuMilli: rec.CPUMilli, MemoryMib: rec.MemoryMiB, DiskMib: rec.DiskMiB},
		EnvdVersion:         rec.EnvdVersion,
		AutoPause:           rec.AutoPause,
		AutoPauseFilesOnly:  rec.AutoPauseFilesOnly,
		AllowInternetAccess: rec.AllowInternetAccess,
		AutoResume:          rec.AutoResume,
		AllowPublicTraffic:  rec.TrafficAccessToken == "",
		Address:             rec.Address,
		Snapshot:            rec.Snapshot,
		FilesOnly:           rec.FilesOnly,
		MaskRequestHost:     rec.MaskRequestHost,
		VolumeMounts:        toVolumeMounts(rec.VolumeMounts),
	}
	if rec.Egress != nil {
		sb.Egress = &pb.Egress{AllowOut: slices.Clone(rec.Egress.AllowOut), DenyOut: slices.Clone(rec.Egress.DenyOut)}
	}
	if !rec.EndAt.IsZero() {
		sb.EndAt = timestamppb.New(rec.EndAt)
	}
	if rec.State == registry.StatePaused && !rec.PausedAt.IsZero() {
		sb.PausedAt = timestamppb.New(rec.PausedAt)
	}
	if sb.EnvdVersion == "" {
		sb.EnvdVersion = s.envdVersion
	}
	return sb
}
