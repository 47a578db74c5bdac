# A Sidekiq server, for any version: what Sidekiq's own `sidekiq` command
# does, so it takes the same arguments (-r FILE -c N -q QUEUE -t SECONDS).
# The tests run it for the vendored versions (kt_sidekiq_start_v), after
# sidekiq_version.rb, so that nothing activates Debian's gem instead.
require 'sidekiq/cli'

cli = Sidekiq::CLI.instance
cli.parse
cli.run
