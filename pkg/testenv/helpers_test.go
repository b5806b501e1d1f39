package testenv_test

import "github.com/nats-io/nats.go/jetstream"

func jsStream(name, subj string) jetstream.StreamConfig {
	return jetstream.StreamConfig{Name: name, Subjects: []string{subj}, Storage: jetstream.FileStorage}
}
