// Package configs defines the structures and constants used for configuring a container
package configs
