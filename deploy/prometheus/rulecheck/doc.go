// Package rulecheck owns the check of ibvbridge's Prometheus alerting rules (../ibvbridge-alerts.yml): its
// test parses them with Prometheus's own rule parser (model/rulefmt, the parser `promtool check rules`
// uses) and fails on any error. A module of its own, so that Prometheus's dependencies stay out of
// ibvbridge's go.mod; make test runs it.
package rulecheck
