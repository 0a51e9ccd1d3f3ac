package service

import (
	"context"

	"connectrpc.com/connect"

	pb "github.com/skiff-dev/skiff/shared/sandboxdapi/gen/skiff/sandboxd/v1"
)

// Info describes the host for its NodeInventory: capacity (after
// overcommit: what placement may hand out; CPU shared, when not admitted), what is allocated (including
// creates in flight), templates, runtime, envd version and snapshots.
func (s *Service) Info(_ context.Context, _ *connect.Request[pb.InfoRequest]) (*connect.Response[pb.InfoResponse], error) {
	ts, err := s.templates.List()
	if err != nil {
		return nil, toConnect(err)
	}
	limits := s.cfg.Limits
	used := s.reg.Usage()
	resp := &pb.InfoResponse{
		NodeName:     s.cfg.NodeName,
		Tag:          string(s.tag),
		Capacity:     &pb.Resources{CpuMilli: limits.CPUMilli, MemoryMib: limits.MemoryMiB},
		CpuShared:    limits.CPUShared,
		MaxSandboxes: int32(min(limits.MaxSandboxes, 1<<31-1)),
		Allocated:    &pb.Resources{CpuMilli: used.CPUMilli, MemoryMib: used.MemoryMiB},
		Sandboxes:    int32(min(used.Sandboxes, 1<<31-1)),
		Runtime:      s.rt.Name(),
		EnvdVersion:  s.envdVersion,
	}
	pressure := s.lastPressure()
	resp.DiskPressure, resp.VolumeDiskPressure = pressure.state, pressure.volumes
	for _, t := range ts {
		resp.Templates = append(resp.Templates, &pb.TemplateVersion{Name: t.Name, Version: t.Version})
	}
	if s.snapshots != nil {
		for _, r := range s.snapshots.All() {
			resp.Snapshots = append(resp.Snapshots, toSnapshot(r))
		}
	}
	if s.volumes != nil {
		// A shared store's volumes are every host's: none is listed. A
		// store that cannot be read leaves the volumes out, not the host.
		resp.SharedVolumeStore = s.volumes.SharedID()
		if resp.SharedVolumeStore == "" {
			vs, err := s.volumes.List("")
			if err != nil {
				s.log.Error("list the host's volumes for its inventory", "error", err)
			}
			for _, v := range vs {
				resp.Volumes = append(resp.Volumes, toVolume(v, -1))
			}
		}
	}
	return connect.NewResponse(resp), nil
}
