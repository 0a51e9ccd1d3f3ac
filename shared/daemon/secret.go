package daemon

import (
	"fmt"
	"os"
	"strings"
)

// ReadSecretFile reads a token or key file named by flag: the secret is the
// file's content without surrounding white space, and it must be at least
// minLen bytes (at least one: an empty file is refused, never taken as "no
// secret").
func ReadSecretFile(flag, path string, minLen int) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", flag, err)
	}
	secret := strings.TrimSpace(string(data))
	switch {
	case secret == "":
		return "", fmt.Errorf("%s %s is empty", flag, path)
	case len(secret) < minLen:
		return "", fmt.Errorf("%s %s: must hold at least %d bytes, it holds %d", flag, path, minLen, len(secret))
	}
	return secret, nil
}
