# Runs sidekiq.rb against the Redis URL given first, for a test whose Redis
# is not the fixture's (the new master after a failover, the plain port of a
# TLS server):
#
#   ruby at_url.rb redis://127.0.0.1:PORT/0 processes
ENV['REDIS_URL'] = ARGV.shift
load File.join(__dir__, 'sidekiq.rb')
