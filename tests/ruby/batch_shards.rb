# Makes a parent batch and a child batch from Ruby through
# Capstan::Shards, for tests/test_shard_home.c. SHARDS is
# "s1=URL,s2=URL,s3=URL" in capstan.yml's order.
#
#   ruby batch_shards.rb SHARDS   a parent homed away from s1 with one
#                                 ShardJob and a success callback ShardJob;
#                                 inside it a child whose bid picks another
#                                 shard, with two ShardJobs and a success
#                                 callback ShardJob; then the child reopened
#                                 for one more. Prints "PARENT bid shard" and
#                                 "CHILD bid shard".
require 'sidekiq'
require_relative '../../examples/ruby/capstan_shards'
require_relative '../../examples/ruby/capstan_batch'

Redis.sadd_returns_boolean = false if defined?(Redis) && Redis.respond_to?(:sadd_returns_boolean=)
Sidekiq.configure_client { |c| c.redis = { url: ENV.fetch('REDIS_URL') } }
Sidekiq.logger.level = Logger::WARN

shards = ARGV.fetch(0).split(',').to_h { |kv| kv.split('=', 2) }
Capstan::Shards.configure(shards: shards.transform_values { |url| { url: url } })
names = Capstan::Shards.names
job = -> { Sidekiq::Client.push('class' => 'ShardJob', 'args' => [], 'queue' => 'default') }

parent = nil
parent = Capstan::Batch.new(description: 'parent') until parent && parent.home != names[0]
parent.on(:success, 'ShardJob')
child = nil
parent.jobs do
  job.call
  child = Capstan::Batch.new(parent_bid: parent.bid)
  child = Capstan::Batch.new(parent_bid: parent.bid) while Capstan::Shards.pick(child.bid, names) == parent.home
  child.on(:success, 'ShardJob')
  child.jobs { 2.times { job.call } }
end
Capstan::Batch.new(child.bid).jobs { job.call }
puts "PARENT #{parent.bid} #{parent.home}"
puts "CHILD #{child.bid} #{child.home}"
